"""DVC stage `smoke_inputs`: the smoke scale's generated stand-ins for ImageNet, the SD-VAE, Inception and ADM's batch.

At ``scale: smoke`` it writes them under ``data/smoke`` (vcarepro.tools.standins), where the smoke scale's paths
point. At every other scale it writes only a note, the same bytes at every such scale, so the stages that depend
on it never re-run for it.
"""

from __future__ import annotations

from vcarepro.core.io import atomic_directory
from vcarepro.core.stage import run_stage
from vcarepro.params.config import section, stage_params
from vcarepro.params.runs import SMOKE_INPUTS


def main() -> None:
    params = stage_params()
    p = section(params, "smoke")
    root = SMOKE_INPUTS
    if params["scale"] != "smoke":
        with atomic_directory(root) as tmp:
            (tmp / "README.txt").write_text(
                "The smoke scale's generated stand-ins (python -m vcarepro.tools.standins) go here; other scales do "
                "not use them.\n"
            )
        print(f"smoke_inputs: scale={params['scale']}, no stand-ins needed")
        return
    from vcarepro.tools.standins import write_standins

    for name, path, _ in write_standins(
        root,
        seed=p["seed"],
        classes=p["classes"],
        train_per_class=p["train_per_class"],
        val_per_class=p["val_per_class"],
        reference_images=p["reference_images"],
        calibrate=params["calibrate"],
    ):
        print(f"smoke_inputs: {name} -> {path}")


if __name__ == "__main__":
    run_stage(main)
