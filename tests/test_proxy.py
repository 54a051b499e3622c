"""The proxy scale (one GPU, a night): ImageNet-100, DeiT-T and DiT-S/2, MHSA vs VCA, three seeds each."""

from __future__ import annotations

import re

import pytest
import torch

from vcarepro.params.config import compose
from vcarepro.params.runs import cls_run, gen_run
from vcarepro.params.schema import validate
from vcarepro.train.classification import ClassifierSpec, build_optimizer, build_scheduler
from vcarepro.train.generation import GeneratorSpec, make_objective
from vcarepro.train.precision import MixedPrecision


@pytest.fixture(scope="module")
def proxy():
    params = compose(["scale=proxy"])
    validate(params, "scale=proxy")
    return params


def test_the_proxy_runs_the_two_main_comparisons_with_three_seeds_and_nothing_else(proxy):
    assert proxy["scale"] == "proxy"
    assert set(proxy["cls_runs"]) == {"deit_tiny-mhsa", "deit_tiny-vca"}
    assert set(proxy["gen_runs"]) == {"dit_s2-mhsa", "dit_s2-vca"}
    for branch in ("cls_runs", "gen_runs"):
        assert all(run["seeds"] == [0, 1, 2] for run in proxy[branch].values())
    # the same recipe on both sides: the difference is the attention
    mhsa, vca = cls_run(proxy, "deit_tiny-mhsa"), cls_run(proxy, "deit_tiny-vca")
    assert mhsa.recipe_name == vca.recipe_name == "lab_deit_tiny" and mhsa.recipe == vca.recipe
    assert mhsa.recipe.img_size == 224 and mhsa.shape == {} and 0 < mhsa.recipe.epochs < 300
    assert all(gen_run(proxy, r).objective == "ddpm" for r in proxy["gen_runs"])
    assert 0 < proxy["gen_recipe"]["steps"] < 400_000 and proxy["gen_recipe"]["batch_size"] == 256


def test_the_proxy_data_is_cmcs_imagenet_100_and_its_fid_reference_is_its_own(proxy):
    classes = proxy["prepare_cls"]["subset_classes"]
    assert len(classes) == len(set(classes)) == 100 and all(re.fullmatch(r"n\d{8}", w) for w in classes)
    # HobbitLong/CMC imagenet100.txt: first, a few inside, last
    assert classes[0] == "n02869837" and classes[49] == "n03379051" and classes[-1] == "n02090622"
    assert proxy["prepare_cls"]["source"] == "imagenet" and proxy["prepare_cls"]["subset_count"] is None
    assert proxy["prepare_gen"]["source"] == "vae_latents" and proxy["prepare_gen"]["fid_extractor"] == "inception"
    assert proxy["fid_reference"]["adm_npz"] is None  # ADM's batch is 1000-class ImageNet
    assert proxy["sampling"]["num_samples"] <= proxy["fid_reference"]["keep_features"]
    assert proxy["sampling"]["num_samples"] % proxy["sampling"]["batch_size"] == 0


@pytest.mark.parametrize("run", ["deit_tiny-mhsa", "deit_tiny-vca"])
def test_every_proxy_classifier_builds_and_takes_a_step_with_its_recipe_at_tiny_shape(proxy, run):
    r = cls_run(proxy, run)
    torch.manual_seed(0)
    spec = ClassifierSpec(
        r.model["arch"],
        r.model["attention"],
        r.model.get("options") or {},
        {"img_size": 32, "depth": 1, "contrast_tokens": 4},
    )  # 2x2 patch grid at 32 px
    model = spec.create(num_classes=100, drop_path=r.recipe.drop_path)
    optimizer = build_optimizer(model, r.recipe)
    scheduler, epochs = build_scheduler(optimizer, r.recipe, updates_per_epoch=2)
    assert epochs == r.recipe.epochs  # cooldown included
    before = {k: v.clone() for k, v in model.state_dict().items()}
    amp = MixedPrecision(r.recipe.precision, torch.device("cpu"))
    with amp.autocast():
        loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 99]))
    loss.backward()
    scheduler.step_update(num_updates=1)
    optimizer.step()
    assert torch.isfinite(loss)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any("attn" in k for k in changed) and any("head" in k for k in changed)


@pytest.mark.parametrize("run", ["dit_s2-mhsa", "dit_s2-vca"])
def test_every_proxy_generator_builds_and_takes_a_step_with_its_recipe_at_tiny_shape(proxy, run):
    r = gen_run(proxy, run)
    torch.manual_seed(0)
    spec = GeneratorSpec(
        r.model["arch"],
        r.model["attention"],
        r.model.get("options") or {},
        {"input_size": 8, "depth": 1, "num_classes": 100, "contrast_tokens": 4},
    )
    model = spec.create(learn_sigma=r.recipe.learn_sigma, class_dropout_prob=r.recipe.class_dropout_prob)
    optimizer = torch.optim.AdamW(model.parameters(), lr=r.recipe.lr, weight_decay=r.recipe.weight_decay)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    amp = MixedPrecision(r.recipe.precision, torch.device("cpu"))
    objective = make_objective(r.objective, r.recipe.flow_path)
    # DiT zero-initialises the adaLN gates and the final layer: the attention's own weights move from
    # the third step on (final layer, then the gates, then what they gate)
    for _ in range(3):
        with amp.autocast():  # SD-VAE latents: 4 channels
            loss = objective.training_losses(model, torch.randn(2, 4, 8, 8), torch.tensor([3, 97]))["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items() if ".attn." in k)
