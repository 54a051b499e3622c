"""The paper-scale road on a miniature ImageNet in the official layout (issue 21): each problem a first real run
met, driven through the real stage processes on real JPEGs of varied sizes."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from PIL import Image

from helpers import ROOT, one_error_line, prepared, smoke_params, stage  # noqa: F401  (prepared: fixtures)
from vcarepro.core.errors import USER_ERROR_STATUS
from vcarepro.data.folders import read_image, read_manifest
from vcarepro.params.config import compose
from vcarepro.params.runs import cls_recipe


def project(tmp_path, prepared):
    shutil.copytree(prepared / "data", tmp_path / "data")
    return tmp_path


def train(tmp_path, run, params):
    return stage(tmp_path, "train_cls.py", "--run", run, params=params)


def history(tmp_path, run):
    return json.loads((tmp_path / "runs" / "cls" / run / "train" / "seed_0" / "history.json").read_text())


def test_randaugment_with_magnitude_noise_never_raises_on_real_images():
    """Problem 1: timm's rand-m9-mstd0.5-inc1 passes bits=0 to Pillow 13's posterize (4 of 3,000 transforms)."""
    import io

    import vcarepro.data.augment as augment
    from vcarepro.tools.standins import synthetic_jpeg
    from vcarepro.train.classification import build_transforms

    recipe = cls_recipe(compose(["scale=paper"]), "deit").model_copy(update={"img_size": 64})
    assert recipe.auto_augment == "rand-m9-mstd0.5-inc1"
    transform = build_transforms(recipe, training=True)
    zero_bits = []
    real = augment.posterize
    augment_ops = [op for t in transform.transforms if hasattr(t, "ops") for op in t.ops if "Posterize" in op.name]
    assert augment_ops and all(op.aug_fn is real for op in augment_ops)
    for op in augment_ops:
        op.aug_fn = lambda img, bits, **kw: (zero_bits.append(bits) if bits <= 0 else None) or real(img, bits, **kw)
    images = [
        Image.open(io.BytesIO(synthetic_jpeg(0, "train", label, i, 4))).convert("RGB")
        for label in range(4)
        for i in range(3)
    ]
    random.seed(0)
    for draw in range(3000):
        transform(images[draw % len(images)])
    assert zero_bits, "3,000 draws should reach level 10 (posterize to 0 bits) a few times"
    black = augment.posterize(images[0], 0)
    assert black.size == images[0].size and not np.asarray(black).any()  # Pillow < 13's result: every bit cleared


@pytest.mark.slow
def test_an_augmenting_recipe_trains_on_real_jpegs_through_the_stage(tmp_path, prepared):
    """Problem 1 at the stage: the deit recipe (RandAugment, mixup, cutmix, erasing, repeated augmentation)."""
    tmp_path = project(tmp_path, prepared)
    params = smoke_params(epochs=2, batch_size=4)
    result = train(tmp_path, "deit_tiny-mhsa", params)
    assert result.returncode == 0, result.stderr
    assert [h["epoch"] for h in history(tmp_path, "deit_tiny-mhsa")] == [1, 2]
    assert np.isfinite(history(tmp_path, "deit_tiny-mhsa")[-1]["train_loss"])


@pytest.mark.slow
@pytest.mark.parametrize("recipe_repeats", [False, True])
def test_a_split_that_cannot_fill_one_step_is_refused_before_any_work(tmp_path, prepared, recipe_repeats):
    """Problem 2: batch 64 over 16 training images trained zero steps and wrote weights, an eval and a report."""
    tmp_path = project(tmp_path, prepared)
    params = smoke_params(batch_size=64 if not recipe_repeats else 4, repeated_aug=recipe_repeats)
    if recipe_repeats:  # timm's sampler rounds an epoch down to 256 images a process once there are 256
        params["cls_recipe_overrides"]["batch_size"] = 32
    result = train(tmp_path, "deit_tiny-mhsa", params)
    assert result.returncode == USER_ERROR_STATUS
    line = one_error_line(result)
    assert "the training split gives 16 images per process and epoch" in line
    assert "cls_recipe_overrides.batch_size" in line
    # nothing trained or written that looks finished (dvclive's empty log folder aside)
    assert not (tmp_path / "runs" / "cls" / "deit_tiny-mhsa" / "train").exists()
    assert not list((tmp_path / "checkpoints").rglob("*.pt")) if (tmp_path / "checkpoints").exists() else True


@pytest.mark.slow
def test_epochs_counts_every_epoch_trained_whatever_the_recipes_cooldown(tmp_path, prepared):
    """Problems 4 and 5: `-S cls_recipe_overrides.epochs=1` failed at paper scale, and trained 11 epochs of CSwin."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vcarepro.params.config",
            "scale=paper",
            "cls_recipe_overrides.epochs=2",
            "cls_recipe_overrides.accum_steps=2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert (written["cls_recipe_overrides"]["epochs"], written["cls_recipe_overrides"]["accum_steps"]) == (2, 1 + 1)

    tmp_path = project(tmp_path, prepared)
    params = smoke_params(epochs=2, cooldown_epochs=1)
    params["cls_runs"]["deit_tiny-mhsa"]["recipe"] = "lab_cswin_tiny"  # 10 cooldown epochs as published
    params["cls_recipe_overrides"]["cooldown_epochs"] = None  # ... kept: refused, not 12 epochs
    result = train(tmp_path, "deit_tiny-mhsa", params)
    assert result.returncode == USER_ERROR_STATUS and "cls_recipe_overrides.cooldown_epochs=0" in one_error_line(result)
    params["cls_recipe_overrides"]["cooldown_epochs"] = 1
    assert train(tmp_path, "deit_tiny-mhsa", params).returncode == 0
    assert [h["epoch"] for h in history(tmp_path, "deit_tiny-mhsa")] == [1, 2]


@pytest.mark.slow
def test_what_a_cpu_runs_badly_is_said_once_and_torchs_worker_warning_is_not_repeated(tmp_path, prepared):
    """Problems 6 and 9: fp16 on a CPU ran 12x slower without a word; `workers: 10` warned on 2 cores every epoch."""
    tmp_path = project(tmp_path, prepared)
    params = smoke_params(epochs=2, precision="bf16", workers=(os.cpu_count() or 1) + 1)
    result = train(tmp_path, "deit_tiny-mhsa", params)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("precision=bf16 autocast on a CPU runs about 12x slower than fp32") == 1
    assert "cls_recipe_overrides.precision=fp32" in result.stdout
    assert result.stdout.count(f"loader workers on {os.cpu_count()} CPUs") == 1
    assert "This DataLoader will create" not in result.stderr


@pytest.mark.slow
def test_the_linear_reference_reads_imagenet_shaped_splits(tmp_path, prepared):
    """Problem 8: cls_reference crashed in np.stack on images of varied sizes."""
    tmp_path = project(tmp_path, prepared)
    images = read_manifest(tmp_path / "data" / "cls", "train")
    sizes = {Image.open(io.BytesIO(read_image(image))).size for image, _ in images}
    assert len(sizes) > 1  # the miniature's images differ in size, as ImageNet's
    result = stage(tmp_path, "cls_reference.py", params=smoke_params())
    assert result.returncode == 0, result.stderr
    reference = json.loads((tmp_path / "metrics" / "cls_reference.json").read_text())
    assert reference["computed"] and reference["features"] == 32 * 32 and 0 <= reference["logreg_top1"] <= 100
    params = smoke_params()
    params["cls_reference"]["image_size"] = None
    line = one_error_line(stage(tmp_path, "cls_reference.py", params=params))
    assert "differ in size" in line and "cls_reference.image_size" in line


@pytest.mark.slow
def test_a_partial_copy_is_refused_with_the_key_to_set(tmp_path):
    """Problem 9: the expect-full error said `expect_full=False`, not the key a user sets."""
    from vcarepro.tools.standins import write_mini_imagenet

    write_mini_imagenet(tmp_path / "ilsvrc", classes=4, train_per_class=1, val_per_class=1, seed=0)
    params = smoke_params()
    params["prepare_cls"].update(imagenet_root=str(tmp_path / "ilsvrc"), expect_full=True, workers=1)
    result = stage(tmp_path, "prepare_cls.py", params=params)
    assert result.returncode == USER_ERROR_STATUS
    assert "set prepare_cls.expect_full=false" in one_error_line(result)


@pytest.mark.slow
def test_a_launched_stage_prints_no_runpy_warning(tmp_path, prepared):
    """Problem 9: every stage launched through the warm server printed runpy's RuntimeWarning about
    vcarepro.train.launch."""
    tmp_path = project(tmp_path, prepared)
    shutil.copytree(ROOT / "stages", tmp_path / "stages")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(smoke_params()))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "VCAREPRO_WARM": "1"}
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "stages" / "run.py"),
            "-m",
            "vcarepro.train.launch",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "1",
            "--node-rank",
            "0",
            "--rdzv-endpoint",
            "file",
            "--launcher",
            "torchrun",
            "stages/train_cls.py",
            "--run",
            "deit_tiny-vca",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "RuntimeWarning" not in result.stderr and "found in sys.modules" not in result.stderr
    assert (tmp_path / "runs" / "cls" / "deit_tiny-vca" / "train" / "seed_0" / "model.safetensors").is_file()
