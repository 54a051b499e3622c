"""DVC stage `cls_reference`: a logistic regression's top-1 on the classification split (the report's reference
line)."""

from __future__ import annotations

from vcarepro.core.io import write_json
from vcarepro.core.stage import run_stage
from vcarepro.metrics.linear_reference import logistic_regression_top1
from vcarepro.params.config import section, stage_params
from vcarepro.params.runs import CLS_DATA


def main() -> None:
    p = section(stage_params(), "cls_reference")
    result = logistic_regression_top1(
        CLS_DATA, max_train_images=p["max_train_images"], c=p["c"], image_size=p["image_size"]
    )
    write_json("metrics/cls_reference.json", result)
    print(
        "cls_reference: "
        + (
            f"logistic regression top-1 {result['logreg_top1']:.2f}%"
            if result["computed"]
            else f"not computed ({result['reason']})"
        )
    )


if __name__ == "__main__":
    run_stage(main)
