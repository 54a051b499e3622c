"""What each recipe knob does to training, checked on the real builders the training stage uses."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from timm.data.distributed_sampler import RepeatAugSampler

from vcarepro.attention import VisualContrastAttention
from vcarepro.core.errors import BadInput
from vcarepro.core.recipes import input_path
from vcarepro.data.embedded import export_digits
from vcarepro.models import create_classifier
from vcarepro.params.config import compose
from vcarepro.params.runs import cls_run
from vcarepro.train.classification import (
    ClassifierSpec,
    best_epoch_figures,
    build_criterion,
    build_optimizer,
    build_scheduler,
    build_transforms,
    make_loader,
    scaled_lrs,
    train_classifier,
    unapplied,
)
from vcarepro.train.distributed import DistInfo

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def paper():
    return compose(["scale=paper"])


def lrs_by_epoch(recipe, updates_per_epoch=4):
    """The lr each optimizer step of each epoch runs with, driven as the training loop drives the scheduler."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=scaled_lrs(recipe)["lr"])
    scheduler, total = build_scheduler(optimizer, recipe, updates_per_epoch)
    out, step = [], 0
    for epoch in range(total):
        seen = []
        for _ in range(updates_per_epoch):
            seen.append(optimizer.param_groups[0]["lr"])
            step += 1
            scheduler.step_update(num_updates=step)
        scheduler.step(epoch + 1)
        out.append(seen)
    return out


def short(recipe, **changes):
    return recipe.model_copy(update={"epochs": 8, "warmup_epochs": 2, "batch_size": 512, **changes})


def test_cooldown_epochs_hold_min_lr_after_the_cosine(paper):
    # lab PVT (10 cooldown epochs, scaled bounds), held at min lr for the last 3 of the 8 epochs trained
    recipe = short(cls_run(paper, "pvt_tiny-vca").recipe, cooldown_epochs=3)
    lrs = lrs_by_epoch(recipe)
    assert len(lrs) == 8
    min_lr = scaled_lrs(recipe)["min_lr"]
    assert all(lr == pytest.approx(min_lr) for epoch in lrs[5:] for lr in epoch)
    assert lrs[4][0] > min_lr  # the cosine itself ends at the 5th epoch


def test_deit_moves_the_lr_once_an_epoch_and_the_lab_every_step(paper):
    deit, lab = cls_run(paper, "deit_small-mhsa").recipe, cls_run(paper, "deit_small-vca").recipe
    per_epoch, per_step = lrs_by_epoch(short(deit)), lrs_by_epoch(short(lab))
    assert all(len(set(epoch)) == 1 for epoch in per_epoch)
    assert all(len(set(epoch)) == 4 for epoch in per_step[:6])
    # warm-up from warmup_lr: DeiT's is not scaled by the batch (1e-6), the lab's is (5e-7 x 4096 / 512)
    assert per_epoch[0][0] == pytest.approx(1e-6)
    assert lrs_by_epoch(short(lab, batch_size=4096))[0][0] == pytest.approx(5e-7 * 8)


@pytest.mark.parametrize(
    "run, lr, warmup_lr, min_lr",
    [
        ("swin_tiny-mhsa", 1e-3, 1e-6, 1e-5),  # Swin: all three scaled by 1024 / 512
        ("deit_tiny-vca", 4e-3, 5e-7 * 8, 5e-6 * 8),  # the lab's DeiT-T at 4096: lr 4e-3
        ("cswin_tiny-mhsa", 2e-3, 1e-6, 1e-5),  # CSWin: --lr 2e-3 at 2048, bounds as given
        ("deit_tiny-mhsa", 1e-3, 1e-6, 1e-5),  # DeiT: only lr scaled
    ],
)
def test_learning_rates_scale_with_the_batch_as_each_original_does(paper, run, lr, warmup_lr, min_lr):
    got = scaled_lrs(cls_run(paper, run).recipe)
    assert got == pytest.approx({"lr": lr, "warmup_lr": warmup_lr, "min_lr": min_lr})


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits") / "cls"
    export_digits(root, val_fraction=0.2, seed=0)
    return root


def test_repeated_augmentation_happens_in_one_process_too(paper, digits):
    from vcarepro.data.folders import ManifestDataset

    recipe = cls_run(paper, "deit_tiny-mhsa").recipe.model_copy(update=dict(batch_size=64, workers=0))
    assert recipe.repeated_aug
    dataset = ManifestDataset(digits, "train", None)
    loader = make_loader(dataset, recipe, CPU, training=True, seed=0)
    assert isinstance(loader.sampler, RepeatAugSampler) and loader.sampler.num_repeats == 3
    indices = list(loader.sampler)
    # each image three times in a row (DeiT's RASampler), len(dataset) // 256 * 256 draws an epoch
    assert len(indices) == len(dataset) // 256 * 256
    assert indices[0] == indices[1] == indices[2] and indices[3] == indices[4] == indices[5]
    without = make_loader(dataset, recipe.model_copy(update={"repeated_aug": False}), CPU, training=True, seed=0)
    assert not isinstance(without.sampler, RepeatAugSampler)


def resize_of(transform):
    from torchvision.transforms import Resize

    return next(t for t in transform.transforms if isinstance(t, Resize))


def test_eval_crop_modes_and_interpolations_follow_the_recipe(paper):
    from torchvision.transforms import InterpolationMode

    deit, lab, cswin = (cls_run(paper, r).recipe for r in ("deit_tiny-mhsa", "deit_tiny-vca", "cswin_tiny-mhsa"))
    assert resize_of(build_transforms(deit, training=False)).size == 256  # the shorter side
    assert tuple(resize_of(build_transforms(lab, training=False)).size) == (256, 256)  # a square (the lab's)
    assert resize_of(build_transforms(cswin, training=False)).size == 248  # CSWin's crop 0.9
    assert resize_of(build_transforms(cswin, training=False)).interpolation == InterpolationMode.BICUBIC
    first = build_transforms(cswin, training=True).transforms[0]  # RandomResizedCrop with random interpolation
    assert isinstance(first.interpolation, (list, tuple)) and len(first.interpolation) == 2


VCA_DECAYED = {"qkv.weight", "embed_pos", "embed_neg", "local_conv.weight", "proj.weight"}
VCA_EXEMPT = {
    "qkv.bias",
    "local_conv.bias",
    "proj.bias",
    "stage1_norm.weight",
    "stage2_norm.weight",
    *(f"lambda{s}.{v}" for s in (1, 2) for v in ("q1", "k1", "q2", "k2")),
}
SMALL = {
    "deit_tiny": dict(img_size=32, patch_size=8, depth=1, contrast_tokens=4),
    "pvt_tiny": dict(img_size=64, depths=(1, 1, 1, 1), contrast_tokens=(9, 16, 16, 4)),
    "swin_tiny": dict(img_size=64, depths=(1, 1, 1, 1), contrast_tokens=(9, 16, 16, 4), window_size=2),
    "cswin_tiny": dict(img_size=64, depths=(1, 1, 1, 1), contrast_tokens=(9, 16, 16, 4)),
}


def decay_split(model, recipe):
    optimizer = build_optimizer(model, recipe)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    exempt = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert decayed | exempt == set(names.values()) and not decayed & exempt
    return decayed, exempt


@pytest.mark.parametrize("arch", SMALL)
def test_vca_lambdas_escape_weight_decay_and_its_embeddings_do_not_in_every_backbone(paper, arch):
    model = create_classifier(arch, "vca", num_classes=5, **SMALL[arch])
    decayed, exempt = decay_split(model, cls_run(paper, "deit_small-vca").recipe)
    layers = [n for n, m in model.named_modules() if isinstance(m, VisualContrastAttention)]
    assert layers
    for layer in layers:
        assert {n.removeprefix(layer + ".") for n in decayed if n.startswith(layer + ".")} == VCA_DECAYED
        assert {n.removeprefix(layer + ".") for n in exempt if n.startswith(layer + ".")} == VCA_EXEMPT


def test_each_backbone_exempts_what_its_original_code_exempts(paper):
    recipe = cls_run(paper, "pvt_tiny-mhsa").recipe
    _, exempt = decay_split(
        create_classifier("pvt_tiny", "mhsa", num_classes=5, img_size=64, depths=(1, 1, 1, 1)), recipe
    )
    assert "stages.3.cls_token" in exempt and not any("pos_embed" in n for n in exempt)  # PVT: {'cls_token'}
    _, exempt = decay_split(timm.create_model("deit_tiny_patch16_224", num_classes=5, depth=1), recipe)
    assert {"pos_embed", "cls_token"} <= exempt  # DeiT (timm's ViT): {'pos_embed', 'cls_token', 'dist_token'}
    _, exempt = decay_split(
        create_classifier("swin_tiny", "mhsa", num_classes=5, img_size=64, depths=(1, 1, 1, 1), window_size=2), recipe
    )
    assert any(n.endswith("relative_position_bias_table") for n in exempt)  # Swin: its keyword


def test_training_keeps_every_epochs_validation_and_eval_reads_the_best_epoch(tmp_path, digits, one_torch_thread):
    embedded = compose([])
    recipe = cls_run(embedded, "deit_tiny-vca").recipe.model_copy(update=dict(epochs=3, batch_size=256, ema_decay=0.9))
    spec = ClassifierSpec("deit_tiny", "vca", {}, dict(embedded["cls_shape"], depth=1, embed_dim=32))
    train_classifier(
        spec=spec,
        recipe=recipe,
        data_root=digits,
        seed=0,
        out_dir=tmp_path / "out",
        ckpt_dir=tmp_path / "ckpt",
        info=CPU,
        fingerprint="f",
    )
    history = json.loads((tmp_path / "out" / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert all({"val_top1", "val_top1_ema", "train_loss", "train_lr"} <= set(h) for h in history)
    assert not any("seconds" in key for h in history for key in h)  # a DVC output: no wall time
    best = best_epoch_figures(tmp_path / "out")
    assert best["top1_best"] == max(h["val_top1"] for h in history)
    assert history[best["best_epoch"] - 1]["val_top1"] == best["top1_best"]
    assert best["top1_best_ema"] == max(h["val_top1_ema"] for h in history)
    with pytest.raises(FileNotFoundError, match="history.json is missing.*retrain the run"):
        best_epoch_figures(tmp_path / "nowhere")


def test_an_epochs_override_trains_that_many_epochs_whatever_the_recipes_cooldown(paper):
    """Issue 21 (4): `epochs=1` on lab_cswin_tiny (10 cooldown epochs) trained 11 epochs."""
    params = compose(["scale=paper", "cls_recipe_overrides.epochs=2", "cls_recipe_overrides.cooldown_epochs=1"])
    for run in ("cswin_tiny-vca", "pvt_tiny-vca", "cswin_tiny-mhsa", "deit_tiny-vca"):
        assert len(lrs_by_epoch(cls_run(params, run).recipe)) == 2
    # a cooldown that leaves no epoch of the schedule is refused, naming the knob to change
    params = compose(["scale=paper", "cls_recipe_overrides.epochs=1"])
    with pytest.raises(BadInput, match="cooldown_epochs=10 .* epochs=1 .* cls_recipe_overrides.cooldown_epochs=0"):
        cls_run(params, "cswin_tiny-vca")
    assert len(lrs_by_epoch(cls_run(params, "deit_tiny-vca").recipe)) == 1


@pytest.mark.parametrize("scale", ["embedded", "proxy", "paper"])
def test_every_recipe_knob_overrides_plainly_at_every_scale(scale):
    """Issue 21 (5): `-S cls_recipe_overrides.epochs=1` failed at paper scale (Hydra needs `+` for an absent key)."""
    from vcarepro.core.recipes import ClsRecipe

    params = compose(
        [
            f"scale={scale}",
            "cls_recipe_overrides.accum_steps=2",
            "cls_recipe_overrides.epochs=3",
            "cls_recipe_overrides.cooldown_epochs=0",
        ]
    )
    assert set(params["cls_recipe_overrides"]) == set(ClsRecipe.model_fields)
    for run in params["cls_runs"]:
        recipe = cls_run(params, run).recipe
        assert (recipe.accum_steps, recipe.epochs) == (2, 3)
    # null keeps each run's own recipe value
    untouched = compose([f"scale={scale}"])
    for run in untouched["cls_runs"]:
        named = untouched["cls_recipes"][untouched["cls_runs"][run]["recipe"]]
        overrides = {k: v for k, v in untouched["cls_recipe_overrides"].items() if v is not None}
        assert cls_run(untouched, run).recipe.model_dump() == {**named, **overrides}


def test_a_runs_optimizer_steps_count_its_cooldown_once(paper):
    """What the preflight and the bench project: CSwin-T's 310 epochs (300 + 10 cooldown), not 320."""
    from vcarepro.train.classification import recipe_steps

    recipe = cls_run(paper, "cswin_tiny-vca").recipe
    assert (recipe.epochs, recipe.cooldown_epochs) == (310, 10)
    assert recipe_steps(recipe, 1_281_167) == 310 * (1_281_167 // recipe.batch_size)


@pytest.mark.parametrize("sched", ["cosine", "step", "multistep"])
def test_epochs_trained_are_the_recipes_whatever_the_scheduler(paper, sched):
    """timm adds the cooldown back to its count only for cycle schedulers; the recipe's epochs count it once."""
    recipe = short(cls_run(paper, "pvt_tiny-vca").recipe, sched=sched, cooldown_epochs=3)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    assert build_scheduler(optimizer, recipe, updates_per_epoch=4)[1] == recipe.epochs == 8


def test_an_override_switches_off_what_a_recipes_null_means_off(paper):
    """null in the overrides keeps the recipe; `none` (auto_augment, compile) and 0 (clip_grad) switch off."""
    from timm.data.auto_augment import RandAugment

    from vcarepro.train.classification import build_transforms
    from vcarepro.train.precision import maybe_compile

    params = compose(["scale=paper", "cls_recipe_overrides.auto_augment=none", "cls_recipe_overrides.compile=none"])
    recipe = cls_run(params, "deit_tiny-mhsa").recipe
    assert not any(isinstance(t, RandAugment) for t in build_transforms(recipe, training=True).transforms)
    module = torch.nn.Linear(2, 2)
    assert maybe_compile(module, recipe.compile) is module
    kept = cls_run(compose(["scale=paper", "cls_recipe_overrides.auto_augment=null"]), "deit_tiny-mhsa").recipe
    assert any(isinstance(t, RandAugment) for t in build_transforms(kept, training=True).transforms)


def test_the_knobs_explain_leaves_out_change_nothing_the_training_builds(paper):
    """classification.unapplied (what `vcarepro explain` leaves out of a run's knobs) names knobs the training
    truly ignores: with train_augment false the training transform is the same whatever they hold, and with
    mixup and cutmix at 0 no mixing is built whatever mixup_switch_prob holds; switched on, they are read."""
    plain = cls_run(paper, "deit_tiny-vca").recipe.model_copy(update=dict(train_augment=False, mixup=0.0, cutmix=0.0))
    other = {"auto_augment": "rand-m1", "color_jitter": 0.3, "train_interpolation": "bilinear", "scale": [0.5, 1.0]}
    other.update({"hflip": 0.0, "reprob": 0.9, "mixup_switch_prob": 0.9, "input_path": "pil"})
    assert set(other) == set(unapplied(plain))
    mixed = plain.model_copy(update=other)
    assert repr(build_transforms(plain, training=True)) == repr(build_transforms(mixed, training=True))
    augments = plain.model_copy(update={"train_augment": True})
    assert input_path(plain) == input_path(mixed) == "pil" != input_path(augments)
    assert build_criterion(mixed, 10)[0] is None
    augmenting = plain.model_copy(update={"train_augment": True, "cache_images": True})
    assert "auto_augment" not in unapplied(augmenting) and unapplied(augmenting)["cache_images"]
    assert "input_path" not in unapplied(augmenting)
    for knob in ("auto_augment", "train_interpolation", "scale", "hflip", "reprob"):  # jitter: skipped under RA
        changed = augmenting.model_copy(update={knob: other[knob]})
        assert repr(build_transforms(changed, training=True)) != repr(build_transforms(augmenting, True)), knob
