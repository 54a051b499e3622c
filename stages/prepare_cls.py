"""DVC stage `prepare_cls`: the classification dataset in the shared layout (data/cls)."""

from __future__ import annotations

from vcarepro.core import progress
from vcarepro.core.stage import run_stage
from vcarepro.data.embedded import export_digits
from vcarepro.data.imagenet import prepare_imagenet
from vcarepro.params.config import section, stage_params
from vcarepro.params.runs import CLS_DATA


def main() -> None:
    params = stage_params()
    progress.configure(params, "prepare_cls")
    p = section(params, "prepare_cls")
    if p["source"] == "digits":
        counts = export_digits(CLS_DATA, val_fraction=p["val_fraction"], seed=p["split_seed"])
    elif p["source"] == "imagenet":
        counts = prepare_imagenet(
            p["imagenet_root"],
            CLS_DATA,
            subset_classes=p["subset_classes"],
            subset_count=p["subset_count"],
            subset_seed=p["split_seed"],
            expect_full=p["expect_full"],
            max_bad_fraction=p["max_bad_fraction"],
            workers=p["workers"],
            drop_empty_classes=p["drop_empty_classes"],
            other_copy=p["other_copy"],
        )
    else:
        raise SystemExit(f"prepare_cls.source={p['source']!r} is unknown; use 'digits' or 'imagenet'.")
    print(
        f"prepare_cls: {counts['train']} train / {counts['val']} val images, {counts['classes']} classes -> {CLS_DATA}"
    )


if __name__ == "__main__":
    run_stage(main)
