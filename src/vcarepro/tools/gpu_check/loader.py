"""The fast input path on the device (part ``loader``): its device side at the recipe's per-device batch, a training
step fed by it beside the same step on a batch already there, and what one of this machine's CPU cores feeds.

Each fed step augments as training's ``DevicePrefetcher`` does but on the training stream, so its time includes
all the device does for its input (training overlaps that with the previous step).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from vcarepro.tools.gpu_check.parts import FAIL, PASS, Check, Outcome, one_line

RUN = "deit_tiny-vca"  # the lab's DeiT-T recipe: RandAugment, erasing, Mixup / CutMix; 512 images per GPU on 8
TINY_CROPS = 4


def loader_part(check: Check, outcome: Outcome) -> None:
    import torch

    from vcarepro.params.runs import cls_run
    from vcarepro.tools.bench.loader import cpu_rates, device_feed, write_imagenet_like_jpegs
    from vcarepro.tools.bench.timing import measure_step, timed
    from vcarepro.tools.bench.train_step import classification_step
    from vcarepro.tools.gpu_check.steps import TINY_CLASSES, composed, tiny

    device = check.device
    run = cls_run(composed("paper"), RUN)
    batch = run.recipe.batch_size // (check.options.get("paper_devices") or 8)
    if check.tiny:
        run, batch = tiny(run, "cls"), TINY_CROPS
    classes = TINY_CLASSES if check.tiny else 1000
    with tempfile.TemporaryDirectory(prefix="gpu-check-photos-") as tmp:
        root = write_imagenet_like_jpegs(Path(tmp), count=8 if check.tiny else 64)
        # on the training stream here: the step's time holds all the device does for its input
        draws, feed = device_feed(root, run.recipe, batch=batch, device=device)
        per_core = cpu_rates(root, run.recipe, seconds=0.5 if check.tiny else 4.0, rounds=1, paths=("fast",))

    repeats = 1 if check.tiny else 5
    row = {"id": "device side", "batch": batch, "img_size": draws.size}
    try:
        images, _ = feed()  # the warm-up, and the check that it gives the model's input
        ok = tuple(images.shape) == (batch, 3, draws.size, draws.size) and bool(torch.isfinite(images).all())
        seconds = timed(feed, repeats, device=device)
        row.update(ms=1e3 * seconds, ms_per_image=1e3 * seconds / batch)
        row["status"], row["reason"] = (PASS, f"{row['ms_per_image']:.3f} ms an image") if ok else (FAIL, "bad output")
    except Exception as err:  # noqa: BLE001 - the part's rows say what failed
        row["status"], row["reason"] = FAIL, one_line(err)
    outcome.rows.append(row)
    if check.out_of_time(outcome, 1, 2, "rows"):
        return
    row = {"id": f"{RUN} step fed by it", "batch": batch, "precision": run.recipe.precision}
    try:
        finite = []
        for name, step_feed in (("plain_step_ms", None), ("fed_step_ms", feed)):
            measured = measure_step(
                lambda b: classification_step(run, batch=b, device=str(device), num_classes=classes, feed=step_feed),
                batch,
                device,
                repeats=repeats,
                warmup=0 if check.tiny else 1,
                after=lambda step: finite.append(all(bool(torch.isfinite(p).all()) for p in step.model.parameters())),
            )
            if measured.seconds is None:
                raise MemoryError(f"out of memory at every batch down to 1 (from {batch})")
            row[name] = 1e3 * measured.seconds
        fed_per_s = batch / row["fed_step_ms"] * 1e3
        core = per_core["fast"]["images_per_s"]
        row.update(
            device_side_share=1 - row["plain_step_ms"] / row["fed_step_ms"],
            images_per_s=fed_per_s,
            cpu_core_images_per_s=core,
            cores_needed=fed_per_s / core,
        )
        row["status"] = PASS if all(finite) else FAIL
        row["reason"] = (
            f"{row['fed_step_ms']:.1f} ms a step fed, {row['plain_step_ms']:.1f} ms on a ready batch; "
            f"{fed_per_s:.0f} images/s take {row['cores_needed']:.1f} of this machine's cores at {core:.0f} a core"
            if all(finite)
            else "a parameter is not finite after the fed steps"
        )
    except Exception as err:  # noqa: BLE001
        row["status"], row["reason"] = FAIL, one_line(err)
    outcome.rows.append(row)
    outcome.summary = "; ".join(r["reason"] for r in outcome.rows)
