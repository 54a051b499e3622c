"""params.yaml is the composition of conf/; the scale switch changes only what a scale needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers import ROOT
from vcarepro.params.config import compose, write_params
from vcarepro.params.runs import cls_recipe, cls_run, gen_run


@pytest.fixture(scope="module")
def embedded():
    return compose([])


@pytest.fixture(scope="module")
def paper():
    return compose(["scale=paper"])


def test_committed_params_yaml_is_the_default_composition(tmp_path, embedded):
    assert yaml.safe_load((ROOT / "params.yaml").read_text()) == embedded
    write_params([], out=tmp_path / "params.yaml")  # DVC's own dumper, as `dvc exp run` uses
    assert (tmp_path / "params.yaml").read_text() == (ROOT / "params.yaml").read_text()


def test_params_yaml_holds_the_bytes_dvcs_own_hydra_dumper_writes(tmp_path):
    """`dvc exp run -S` writes params.yaml with compose_and_dump; the command checks first, then writes the same."""
    from dvc.utils.hydra import compose_and_dump

    overrides = ["scale=paper", "cls_recipe@cls_recipes.deit=lab", "cls_recipe_overrides.epochs=30"]
    compose_and_dump(tmp_path / "dvc.yaml", str(ROOT / "conf"), None, "config", "", overrides)
    write_params(overrides, out=tmp_path / "ours.yaml")
    assert (tmp_path / "ours.yaml").read_bytes() == (tmp_path / "dvc.yaml").read_bytes()


def test_default_scale_is_embedded_and_paper_is_one_override_away(embedded, paper):
    assert embedded["scale"] == "embedded" and paper["scale"] == "paper"
    assert embedded["prepare_cls"]["source"] == "digits" and paper["prepare_cls"]["source"] == "imagenet"
    assert paper["cls_shape"] == {} and paper["gen_shape"] == {}


def test_paper_scale_carries_the_deit_and_dit_recipes(paper):
    """facebookresearch/deit at its first commit (main.py, datasets.py, engine.py, README)."""
    r = paper["cls_recipes"]["deit"]
    assert (r["epochs"], r["cooldown_epochs"], r["batch_size"], r["lr"], r["weight_decay"]) == (
        300,
        0,
        1024,
        5e-4,
        0.05,
    )
    assert (r["warmup_epochs"], r["warmup_lr"], r["min_lr"], r["scale_warmup_min_lr"]) == (5, 1e-6, 1e-5, False)
    assert (r["lr_step"], r["drop_path"], r["clip_grad"], r["precision"]) == ("epoch", 0.1, None, "fp16")
    assert r["auto_augment"] == "rand-m9-mstd0.5-inc1" and r["reprob"] == 0.25 and r["smoothing"] == 0.1
    assert (r["mixup"], r["cutmix"], r["mixup_switch_prob"], r["ema_decay"]) == (0.8, 1.0, 0.5, 0.99996)
    assert (r["repeated_aug"], r["crop_pct"], r["crop_mode"], r["color_jitter"]) == (True, 0.875, "center", 0.4)
    # at paper scale every run trains with its named recipe as published: every knob listed, none overridden
    assert set(paper["cls_recipe_overrides"]) == set(r) and set(paper["cls_recipe_overrides"].values()) == {None}
    g = paper["gen_recipe"]
    assert (g["steps"], g["batch_size"], g["lr"], g["weight_decay"], g["ema_decay"]) == (400000, 256, 1e-4, 0.0, 0.9999)
    s = paper["sampling"]
    assert (s["num_samples"], s["ddpm_steps"], s["flow_steps"], s["cfg_scale"]) == (50000, 250, 250, 1.0)


# What the lab's recipe changes against DeiT's. docs/evidence.md names the first six, from LeapLabTHU/Agent-Attention
# agent_transformer/config.py and cfgs/ (20 warm-up epochs, warm-up and minimum lr scaled with the batch like the base
# lr, clipping 5.0, no repeated augmentation); reading LeapLabTHU/Agent-Attention's agent_transformer/ adds the rest:
# main.py keeps no EMA, lr_scheduler.py steps every update, data/build.py resizes to a 256 square before the centre
# crop, and the README's commands pass no --amp (fp32 with PyTorch 1.11's TF32 matmuls).
LAB_VS_DEIT = {
    "warmup_epochs": (5, 20),
    "warmup_lr": (1e-6, 5e-7),
    "min_lr": (1e-5, 5e-6),
    "scale_warmup_min_lr": (False, True),
    "clip_grad": (None, 5.0),
    "repeated_aug": (True, False),
    "ema_decay": (0.99996, 0.0),
    "lr_step": ("epoch", "update"),
    "crop_mode": ("center", "squash"),
    "precision": ("fp16", "tf32"),
}


def test_the_labs_recipe_differs_from_deits_in_exactly_the_evidenced_knobs():
    swapped = compose(["scale=paper", "cls_recipe@cls_recipes.deit=lab"])
    deit, lab = compose(["scale=paper"])["cls_recipes"]["deit"], swapped["cls_recipes"]["deit"]
    assert {k: (deit[k], lab[k]) for k in deit if deit[k] != lab[k]} == LAB_VS_DEIT


@pytest.mark.slow
def test_dvc_params_diff_between_the_original_and_the_labs_recipe_shows_exactly_those_knobs(tmp_path):
    """What a user sees after `dvc exp run -S 'cls_recipe@cls_recipes.deit=lab'`: the knobs, not a name."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def sh(cmd):
        return subprocess.run(cmd, cwd=tmp_path, shell=True, check=True, capture_output=True, text=True, env=env).stdout

    write_params(["scale=paper"], out=tmp_path / "params.yaml")
    (tmp_path / "dvc.yaml").write_text("stages:\n  train:\n    cmd: 'true'\n    params: [cls_recipes.deit]\n")
    sh("git init -q && dvc init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm paper")
    write_params(["scale=paper", "cls_recipe@cls_recipes.deit=lab"], out=tmp_path / "params.yaml")
    diff = json.loads(sh("dvc params diff --json"))["params.yaml"]
    assert {k.removeprefix("cls_recipes.deit."): (v["old"], v["new"]) for k, v in diff.items()} == LAB_VS_DEIT


def test_the_labs_per_model_settings(paper):
    """LeapLabTHU/Agent-Attention agent_transformer/cfgs/agent_{deit_t,deit_s,pvt_t,swin_t,cswin_t}.yaml."""
    recipes = paper["cls_recipes"]
    base = {k: v for k, v in recipes["lab_swin_tiny"].items() if k != "drop_path"}
    assert recipes["lab_deit_tiny"] == {**base, "batch_size": 4096, "drop_path": 0.0}  # 512 per GPU x 8
    assert recipes["lab_deit_small"] == {**base, "drop_path": 0.1}
    assert recipes["lab_swin_tiny"] == {**base, "drop_path": 0.2}
    assert recipes["lab_pvt_tiny"] == {
        **base,
        "drop_path": 0.1,
        "warmup_epochs": 5,
        "epochs": 310,
        "cooldown_epochs": 10,
        "warmup_lr": 1e-6,
        "min_lr": 1e-5,
        "clip_grad": None,
    }
    assert recipes["lab_cswin_tiny"] == {
        **base,
        "drop_path": 0.2,
        "warmup_epochs": 20,
        "epochs": 310,
        "cooldown_epochs": 10,
        "warmup_lr": 1e-6,
        "min_lr": 1e-5,
        "clip_grad": None,
        "ema_decay": 0.99984,
    }
    assert base["batch_size"] == 1024 and base["lr"] * base["batch_size"] / 512 == pytest.approx(1e-3)


def test_backbones_carry_their_original_recipes(paper):
    recipes, deit = paper["cls_recipes"], paper["cls_recipes"]["deit"]
    # PVT: DeiT's code and recipe, less the model EMA (commented out in whai362/PVT's main.py)
    assert recipes["pvt"] == {**deit, "ema_decay": 0.0}
    swin = recipes["swin"]  # microsoft/Swin-Transformer config.py, main.py, swin_tiny_patch4_window7_224.yaml
    assert (swin["drop_path"], swin["warmup_epochs"], swin["warmup_lr"], swin["min_lr"], swin["clip_grad"]) == (
        0.2,
        20,
        5e-7,
        5e-6,
        5.0,
    )
    assert (swin["scale_warmup_min_lr"], swin["lr_step"], swin["ema_decay"], swin["repeated_aug"]) == (
        True,
        "update",
        0.0,
        False,
    )
    cswin = recipes["cswin"]  # microsoft/CSWin-Transformer main.py and README
    assert (cswin["batch_size"], cswin["drop_path"], cswin["ema_decay"], cswin["epochs"], cswin["cooldown_epochs"]) == (
        2048,
        0.2,
        0.99984,
        310,
        10,
    )  # 300 + 10 cooldown epochs, counted in epochs
    assert cswin["lr"] * cswin["batch_size"] / 512 == pytest.approx(2e-3)  # --lr 2e-3 at 8 x 256, not rescaled
    assert (cswin["warmup_lr"], cswin["min_lr"], cswin["scale_warmup_min_lr"]) == (1e-6, 1e-5, False)
    assert (cswin["repeated_aug"], cswin["crop_pct"], cswin["train_interpolation"], cswin["lr_step"]) == (
        False,
        0.9,
        "random",
        "epoch",
    )


# Per backbone: (baseline and its original recipe, the lab recipe every other row uses, the other rows).
TABLE1 = {
    "deit_tiny": ("deit_tiny-mhsa", "deit", "lab_deit_tiny", ["deit_tiny-mhsa-lab", "deit_tiny-vca"]),
    "deit_small": ("deit_small-mhsa", "deit", "lab_deit_small", ["deit_small-mhsa-lab", "deit_small-vca"]),
    "pvt_tiny": ("pvt_tiny-mhsa", "pvt", "lab_pvt_tiny", ["pvt_tiny-mhsa-lab", "pvt_tiny_gap-mhsa", "pvt_tiny-vca"]),
    "swin_tiny": ("swin_tiny-mhsa", "swin", "lab_swin_tiny", ["swin_tiny-mhsa-lab", "swin_tiny-vca"]),
    "cswin_tiny": (
        "cswin_tiny-mhsa",
        "cswin",
        "lab_cswin_tiny",
        ["cswin_tiny-mhsa-lab", "cswin_tiny_2418-mhsa", "cswin_tiny-vca"],
    ),
}
TABLE1_PAPER_ONLY = [
    run
    for base, _, _, others in TABLE1.values()
    for run in [base, *others]
    if run not in ("deit_tiny-mhsa", "deit_tiny-vca")
]
TABLE2_PAPER_ONLY = [
    f"{family}_{size}{patch}-{attention}"
    for family in ("dit", "sit")
    for size, patch in (("s", 4), ("s", 8), ("b", 2), ("b", 4), ("b", 8))
    for attention in ("mhsa", "vca")
]


def test_baselines_keep_their_original_recipe_and_every_other_table1_row_trains_with_the_labs(paper):
    runs = paper["cls_runs"]
    for arch, (baseline, original, lab, others) in TABLE1.items():
        assert runs[baseline]["recipe"] == original
        assert all(runs[r]["recipe"] == lab for r in others), arch
        twin = others[0]  # the matched twin: the baseline's own model, the lab's recipe
        assert runs[twin]["model"] == runs[baseline]["model"] and twin.endswith("-lab")
    ablations = [r for r in runs if r.startswith("deit_tiny-vca-")]
    assert len(ablations) == 5 and all(runs[r]["recipe"] == "lab_deit_tiny" for r in ablations)


def test_every_named_recipe_collapses_into_the_embedded_one(embedded):
    resolved = {name: cls_recipe(embedded, name) for name in embedded["cls_recipes"]}
    assert len({r.model_dump_json() for r in resolved.values()}) == 1
    assert resolved["deit"].epochs == embedded["cls_recipe_overrides"]["epochs"]


def test_paper_scale_runs_the_embedded_matrix_plus_every_table1_and_table2_row(embedded, paper):
    assert list(paper["cls_runs"]) == list(embedded["cls_runs"]) + TABLE1_PAPER_ONLY
    assert list(paper["gen_runs"]) == list(embedded["gen_runs"]) + TABLE2_PAPER_ONLY
    reference = yaml.safe_load((ROOT / "data" / "paper_reference.yaml").read_text())
    assert {row["run"] for row in reference["table1"]["rows"]} == {r for t in TABLE1.values() for r in [t[0], *t[3]]}
    assert {row["run"] for row in reference["table2"]["rows"]} <= set(paper["gen_runs"])
    for params in (embedded, paper):
        for runs in (params["cls_runs"], params["gen_runs"]):
            for name, run in runs.items():
                assert run["model"] in params["models"], name


# Tiny stand-ins for the paper shapes: a 64 px input and per-stage contrast grids that fit each stage
# (3x3 tokens on the first stage's 16x16 grid pool overlapping windows, as 9 tokens on 56x56 do at 224).
TINY = {
    "deit_tiny": dict(img_size=64, contrast_tokens=4),
    "deit_small": dict(img_size=64, contrast_tokens=4),
    "pvt_tiny": dict(img_size=64, depths=(1, 1, 1, 1), contrast_tokens=(9, 16, 16, 4)),
    "pvt_tiny_gap": dict(img_size=64, depths=(1, 1, 1, 1)),
    "swin_tiny": dict(img_size=64, depths=(1, 1, 2, 1), contrast_tokens=(9, 16, 16, 4)),
    "cswin_tiny": dict(img_size=64, depths=(1, 1, 1, 1), contrast_tokens=(9, 16, 16, 4)),
    "cswin_tiny_2418": dict(img_size=64, depths=(1, 1, 1, 1)),
}


@pytest.mark.parametrize("name", TABLE1_PAPER_ONLY)
def test_every_table1_run_builds_and_trains_a_step_on_tiny_inputs(paper, name):
    import torch

    from vcarepro.train.classification import ClassifierSpec

    run = cls_run(paper, name)
    shape = dict(TINY[run.model["arch"]])
    if run.model["attention"] != "vca":
        shape.pop("contrast_tokens", None)
    if run.model["arch"] == "swin_tiny":
        shape["window_size"] = 2  # Swin's own 7x7 windows do not tile a 64 px input's stages
    spec = ClassifierSpec(run.model["arch"], run.model["attention"], run.model.get("options") or {}, shape)
    model = spec.create(num_classes=5, drop_path=run.recipe.drop_path)
    loss = torch.nn.functional.cross_entropy(model(torch.randn(2, 3, 64, 64)), torch.tensor([0, 3]))
    loss.backward()
    assert torch.isfinite(loss)
    assert sum(p.grad is not None for p in model.parameters()) > 0.9 * len(list(model.parameters()))


def test_matrix_holds_every_ablation_row_and_two_seeds_for_headline_pairs(embedded):
    cls_variants = {
        tuple(sorted((embedded["models"][r["model"]].get("options") or {}).items()))
        for r in embedded["cls_runs"].values()
    }
    assert (("stage1", "diff"), ("stage2", "diff")) in cls_variants
    assert (("stage2", "diff"),) in cls_variants and (("stage1", "diff"),) in cls_variants
    assert (("tokens_neg", "emb"), ("tokens_pos", "emb")) in cls_variants and (("tokens_pos", "pool"),) in cls_variants
    for name in ("deit_tiny-mhsa", "deit_tiny-vca"):
        assert len(embedded["cls_runs"][name]["seeds"]) >= 2
    for name in ("dit_s2-mhsa", "dit_s2-vca"):
        assert len(embedded["gen_runs"][name]["seeds"]) >= 2
    objectives = {r["objective"] for r in embedded["gen_runs"].values()}
    assert objectives == {"ddpm", "flow"}


def test_run_resolution_and_its_errors(embedded):
    run = cls_run(embedded, "deit_tiny-vca-stage1_only")
    assert run.model == {"arch": "deit_tiny", "attention": "vca", "options": {"stage2": "diff"}}
    assert (
        run.shape == embedded["cls_shape"]
        and run.paths.metrics.as_posix() == "runs/cls/deit_tiny-vca-stage1_only/metrics.json"
    )
    assert gen_run(embedded, "sit_s2-vca").objective == "flow"
    with pytest.raises(KeyError, match="no run 'deit_huge' under cls_runs"):
        cls_run(embedded, "deit_huge")
    broken = {**embedded, "gen_runs": {"x": {"model": "dit_s2-mhsa", "objective": "gan", "seeds": [0]}}}
    with pytest.raises(ValueError, match="objective 'gan'"):
        gen_run(broken, "x")
    no_seeds = {**embedded, "cls_runs": {"x": {"model": "deit_tiny-mhsa", "recipe": "deit", "seeds": []}}}
    with pytest.raises(ValueError, match="distinct integer seeds"):
        cls_run(no_seeds, "x")
    unknown = {**embedded, "cls_runs": {"x": {"model": "deit_tiny-mhsa", "recipe": "deit3", "seeds": [0]}}}
    with pytest.raises(KeyError, match="no recipe 'deit3' under cls_recipes"):
        cls_run(unknown, "x")


def test_params_flow_into_the_models_each_stage_builds(embedded):
    from vcarepro.train.classification import ClassifierSpec
    from vcarepro.train.generation import GeneratorSpec

    shape = embedded["cls_shape"]
    for name, attention in (("deit_tiny-vca-stage1_only", "vca"), ("deit_tiny-mhsa", "mhsa")):
        run = cls_run(embedded, name)
        model = ClassifierSpec(run.model["arch"], attention, run.model.get("options") or {}, run.shape).create(10)
        assert len(model.blocks) == shape["depth"] and model.embed_dim == shape["embed_dim"]
        assert model.patch_embed.grid_size == (shape["img_size"] // shape["patch_size"],) * 2
        if attention == "vca":  # the scale's contrast-token count reaches VCA, the run's switch too
            attn = model.blocks[0].attn
            assert attn.num_contrast_tokens == shape["contrast_tokens"] and attn.stage2 == "diff"
    gshape = embedded["gen_shape"]
    run = gen_run(embedded, "dit_s2-vca-emb_both")
    dit = GeneratorSpec.for_run(run).create()
    assert len(dit.blocks) == gshape["depth"] and dit.in_channels == gshape["in_channels"]
    assert dit.blocks[0].attn.num_contrast_tokens == gshape["contrast_tokens"]
    assert dit.blocks[0].attn.tokens_pos == "emb" and dit.blocks[0].attn.tokens_neg == "emb"


@pytest.mark.parametrize("name", TABLE2_PAPER_ONLY)
def test_every_table2_run_builds_and_trains_a_step_at_its_latent_shape(paper, name, one_torch_thread):
    import torch

    from vcarepro.train.generation import GeneratorSpec, make_objective

    run = gen_run(paper, name)
    # the paper's width, patch, heads and contrast grid on 32x32x4 latents; one block keeps it fast
    spec = GeneratorSpec.for_run(run, shape={"depth": 1})
    model = spec.create(learn_sigma=run.recipe.learn_sigma, class_dropout_prob=run.recipe.class_dropout_prob)
    objective = make_objective(run.objective, run.recipe.flow_path)
    loss = objective.training_losses(model, torch.randn(2, 4, 32, 32), torch.tensor([3, 999]))["loss"]
    loss.backward()
    assert torch.isfinite(loss)
    assert model.x_embedder.proj.weight.grad is not None


def test_the_smoke_scale_runs_every_distinct_piece_of_the_paper_matrix_as_the_paper_defines_it():
    """Issue 21: scale=smoke drives each architecture, recipe, objective and sampler of the paper matrix
    end to end; each of its runs is the paper scale's entry of the same name, at the paper's shape."""
    smoke, paper = compose(["scale=smoke"]), compose(["scale=paper"])
    for branch in ("cls_runs", "gen_runs"):
        for name, run in smoke[branch].items():
            assert paper[branch][name] == run, name
    assert smoke["cls_shape"] == paper["cls_shape"] == {} and smoke["gen_shape"] == paper["gen_shape"] == {}
    models = paper["models"]
    pieces = lambda p: {  # noqa: E731
        "arch": {models[r["model"]]["arch"] for b in ("cls_runs", "gen_runs") for r in p[b].values()},
        "attention": {models[r["model"]]["attention"] for b in ("cls_runs", "gen_runs") for r in p[b].values()},
        "recipe": {r["recipe"] for r in p["cls_runs"].values()},
        "objective": {r["objective"] for r in p["gen_runs"].values()},
    }
    assert pieces(smoke) == pieces(paper)
    # the recipes are the paper's but for length, batch, loader workers and (on CPUs) precision
    assert {k for k, v in smoke["cls_recipe_overrides"].items() if v is not None} == {
        "epochs",
        "cooldown_epochs",
        "batch_size",
        "workers",
        "precision",
    }
    assert smoke["cls_recipes"] == paper["cls_recipes"] and smoke["models"] == paper["models"]
    assert smoke["sampling"]["ddpm_steps"] < paper["sampling"]["ddpm_steps"]
    assert (smoke["sampling"]["flow_sampler"], smoke["sampling"]["labels"]) == ("sde", "random")
    assert smoke["prepare_gen"]["source"] == "vae_latents" and smoke["prepare_gen"]["image_size"] == 256
    assert smoke["prepare_cls"]["source"] == "imagenet" and smoke["fid_reference"]["adm_npz"].endswith(".npz")
