"""DVC stage `train_gen@RUN`: train every seed of one DiT (DDPM) or SiT (flow) run."""

from __future__ import annotations

import argparse

from vcarepro.core import progress
from vcarepro.core.stage import run_stage
from vcarepro.params.config import stage_params
from vcarepro.params.runs import GEN_DATA, gen_run
from vcarepro.params.stage_facts import stage_facts
from vcarepro.train.generation import GeneratorSpec, train_generator
from vcarepro.train.seeds import train_seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", required=True)
    parser.add_argument("--max-steps", type=int, default=None, help="stop early (tests only)")
    args = parser.parse_args()
    params = stage_params()
    progress.configure(params, "train_gen", args.run)
    run = gen_run(params, args.run)
    spec = GeneratorSpec.for_run(run)

    # a checkpoint resumes only under the facts DVC keys this stage on (every declared param and dependency)
    facts = stage_facts(f"train_gen@{args.run}")

    def train_one(seed, info, live):
        return train_generator(
            spec=spec,
            objective=run.objective,
            recipe=run.recipe,
            data_root=GEN_DATA,
            seed=seed,
            out_dir=run.paths.seed_dir(seed),
            ckpt_dir=run.paths.ckpt_dir(seed),
            info=info,
            live=live,
            max_steps=args.max_steps,
            log_prefix=f"seed_{seed}/",
            fingerprint={"facts": facts, "seed": seed, "max_steps": args.max_steps},
        )

    train_seeds(
        f"train_gen {args.run}",
        run.seeds,
        run.paths.live_dir,
        train_one,
        seed_processes=params["distributed"]["seed_processes"],
    )


if __name__ == "__main__":
    run_stage(main)
