"""params.yaml is the composition of conf/; the scale switch changes only what a scale needs."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vcarepro.config import compose, write_params
from vcarepro.pipeline import cls_run, gen_run

ROOT = Path(__file__).resolve().parents[1]


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


def test_default_scale_is_embedded_and_paper_is_one_override_away(embedded, paper):
    assert embedded["scale"] == "embedded" and paper["scale"] == "paper"
    assert embedded["prepare_cls"]["source"] == "digits" and paper["prepare_cls"]["source"] == "imagenet"
    assert paper["cls_shape"] == {} and paper["gen_shape"] == {}


def test_paper_scale_carries_the_deit_and_dit_recipes(paper):
    r = paper["cls_recipe"]
    assert (r["epochs"], r["batch_size"], r["lr"], r["weight_decay"]) == (300, 1024, 5e-4, 0.05)
    assert (r["warmup_epochs"], r["warmup_lr"], r["min_lr"], r["drop_path"]) == (5, 1e-6, 1e-5, 0.1)
    assert r["auto_augment"] == "rand-m9-mstd0.5-inc1" and r["reprob"] == 0.25 and r["smoothing"] == 0.1
    assert (r["mixup"], r["cutmix"], r["mixup_switch_prob"], r["ema_decay"]) == (0.8, 1.0, 0.5, 0.99996)
    g = paper["gen_recipe"]
    assert (g["steps"], g["batch_size"], g["lr"], g["weight_decay"], g["ema_decay"]) == (400000, 256, 1e-4, 0.0, 0.9999)
    s = paper["sampling"]
    assert (s["num_samples"], s["ddpm_steps"], s["flow_steps"], s["cfg_scale"]) == (50000, 250, 250, 1.0)


TABLE1_PAPER_ONLY = ["deit_small-mhsa", "deit_small-vca", "pvt_tiny-mhsa", "pvt_tiny-vca", "swin_tiny-mhsa",
                     "swin_tiny-vca", "cswin_tiny-mhsa", "cswin_tiny-vca"]


TABLE2_PAPER_ONLY = [f"{family}_{size}{patch}-{attention}" for family in ("dit", "sit")
                     for size, patch in (("s", 4), ("s", 8), ("b", 2), ("b", 4), ("b", 8))
                     for attention in ("mhsa", "vca")]


def test_paper_scale_runs_the_embedded_matrix_plus_every_table1_and_table2_row(embedded, paper):
    assert list(paper["cls_runs"]) == list(embedded["cls_runs"]) + TABLE1_PAPER_ONLY
    assert list(paper["gen_runs"]) == list(embedded["gen_runs"]) + TABLE2_PAPER_ONLY
    reference = yaml.safe_load((ROOT / "data" / "paper_reference.yaml").read_text())
    assert {row["run"] for row in reference["table2"]["rows"]} <= set(paper["gen_runs"])
    for params in (embedded, paper):
        for runs in (params["cls_runs"], params["gen_runs"]):
            for name, run in runs.items():
                assert run["model"] in params["models"], name


def test_backbones_carry_their_published_recipes(paper):
    swin = cls_run(paper, "swin_tiny-vca").recipe
    assert (swin["drop_path"], swin["warmup_epochs"], swin["min_lr"], swin["clip_grad"], swin["ema_decay"]) == \
        (0.2, 20, 5e-6, 5.0, 0.0)
    cswin = cls_run(paper, "cswin_tiny-mhsa").recipe
    assert (cswin["batch_size"], cswin["drop_path"], cswin["ema_decay"]) == (2048, 0.2, 0.99984)
    assert cswin["lr"] * cswin["batch_size"] / 512 == pytest.approx(2e-3)  # CSWin's README: --lr 2e-3 at 8 x 256
    # PVT trains with DeiT's recipe, less the model EMA (commented out in whai362/PVT's main.py)
    assert cls_run(paper, "pvt_tiny-vca").recipe == {**paper["cls_recipe"], "ema_decay": 0.0}
    assert paper["cls_recipe"]["color_jitter"] == 0.4  # facebookresearch/deit main.py default
    broken = {**paper, "cls_runs": {"x": {"model": "deit_tiny-mhsa", "seeds": [0], "recipe": {"epoch": 3}}}}
    with pytest.raises(KeyError, match="overrides epoch, which cls_recipe does not have"):
        cls_run(broken, "x")


# Tiny stand-ins for the paper shapes: a 64 px input and contrast grids that divide each stage.
TINY = {"deit_small": dict(img_size=64, contrast_tokens=4),
        "pvt_tiny": dict(img_size=64, depths=(1, 1, 1, 1), contrast_tokens=(16, 16, 4, 1)),
        "swin_tiny": dict(img_size=64, depths=(1, 1, 2, 1), contrast_tokens=(16, 16, 4, 1)),
        "cswin_tiny": dict(img_size=64, depths=(1, 1, 1, 1), contrast_tokens=(16, 16, 4, 1))}


@pytest.mark.parametrize("name", TABLE1_PAPER_ONLY)
def test_every_table1_run_builds_and_trains_a_step_on_tiny_inputs(paper, name):
    import torch

    from vcarepro.train.classification import ClassifierSpec

    run = cls_run(paper, name)
    shape = dict(TINY[run.model["arch"]])
    if run.model["arch"] == "swin_tiny" and run.model["attention"] == "mhsa":
        shape["window_size"] = 2  # 7x7 windows do not tile a 64 px input
    spec = ClassifierSpec(run.model["arch"], run.model["attention"], run.model.get("vca") or {}, shape)
    model = spec.create(num_classes=5, drop_path=run.recipe["drop_path"])
    loss = torch.nn.functional.cross_entropy(model(torch.randn(2, 3, 64, 64)), torch.tensor([0, 3]))
    loss.backward()
    assert torch.isfinite(loss)
    assert sum(p.grad is not None for p in model.parameters()) > 0.9 * len(list(model.parameters()))


def test_matrix_holds_every_ablation_row_and_two_seeds_for_headline_pairs(embedded):
    cls_variants = {tuple(sorted((embedded["models"][r["model"]].get("vca") or {}).items()))
                    for r in embedded["cls_runs"].values()}
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
    assert run.model == {"arch": "deit_tiny", "attention": "vca", "vca": {"stage2": "diff"}}
    assert run.shape == embedded["cls_shape"] and run.paths.metrics.as_posix() == "runs/cls/deit_tiny-vca-stage1_only/metrics.json"
    assert gen_run(embedded, "sit_s2-vca").objective == "flow"
    with pytest.raises(KeyError, match="no run 'deit_huge' under cls_runs"):
        cls_run(embedded, "deit_huge")
    broken = {**embedded, "gen_runs": {"x": {"model": "dit_s2-mhsa", "objective": "gan", "seeds": [0]}}}
    with pytest.raises(ValueError, match="objective 'gan'"):
        gen_run(broken, "x")
    no_seeds = {**embedded, "cls_runs": {"x": {"model": "deit_tiny-mhsa", "seeds": []}}}
    with pytest.raises(ValueError, match="distinct integer seeds"):
        cls_run(no_seeds, "x")


def test_params_flow_into_the_models_each_stage_builds(embedded):
    from vcarepro.train.classification import ClassifierSpec
    from vcarepro.train.generation import GeneratorSpec

    shape = embedded["cls_shape"]
    for name, attention in (("deit_tiny-vca-stage1_only", "vca"), ("deit_tiny-mhsa", "mhsa")):
        run = cls_run(embedded, name)
        model = ClassifierSpec(run.model["arch"], attention, run.model.get("vca") or {}, run.shape).create(10)
        assert len(model.blocks) == shape["depth"] and model.embed_dim == shape["embed_dim"]
        assert model.patch_embed.grid_size == (shape["img_size"] // shape["patch_size"],) * 2
        if attention == "vca":  # the scale's contrast-token count reaches VCA, the run's switch too
            attn = model.blocks[0].attn
            assert attn.num_contrast_tokens == shape["contrast_tokens"] and attn.stage2 == "diff"
    gshape = embedded["gen_shape"]
    run = gen_run(embedded, "dit_s2-vca-emb_both")
    dit = GeneratorSpec(run.model["arch"], run.model["attention"], run.model["vca"], run.shape).create()
    assert len(dit.blocks) == gshape["depth"] and dit.in_channels == gshape["in_channels"]
    assert dit.blocks[0].attn.num_contrast_tokens == gshape["contrast_tokens"]
    assert dit.blocks[0].attn.tokens_pos == "emb" and dit.blocks[0].attn.tokens_neg == "emb"


@pytest.mark.parametrize("name", TABLE2_PAPER_ONLY)
def test_every_table2_run_builds_and_trains_a_step_at_its_latent_shape(paper, name, one_torch_thread):
    import torch

    from vcarepro.train.generation import GeneratorSpec, make_objective

    run = gen_run(paper, name)
    # the paper's width, patch, heads and contrast grid on 32x32x4 latents; one block keeps it fast
    spec = GeneratorSpec(run.model["arch"], run.model["attention"], run.model.get("vca") or {}, {"depth": 1})
    model = spec.create(learn_sigma=run.recipe["learn_sigma"], class_dropout_prob=run.recipe["class_dropout_prob"])
    objective = make_objective(run.objective, run.recipe["flow_path"])
    loss = objective.training_losses(model, torch.randn(2, 4, 32, 32), torch.tensor([3, 999]))["loss"]
    loss.backward()
    assert torch.isfinite(loss)
    assert model.x_embedder.proj.weight.grad is not None
