"""The attention family through the real `dvc repro`: every member and control on both branches."""
from __future__ import annotations

import json
import math

import pytest

from vcarepro.attention_names import FAMILY
from vcarepro.config import compose

from test_pipeline import reproduced_repo

MEMBERS = [*FAMILY, "mhsa_dwc", "vca-no_dwc"]
CLS_RUNS = ["deit_tiny-mhsa", "deit_tiny-vca", *(f"deit_tiny-{m}" for m in MEMBERS)]
GEN_RUNS = ["dit_s2-mhsa", "dit_s2-vca", *(f"dit_s2-{m}" for m in MEMBERS)]


def family_params() -> dict:
    """`family=all` at the embedded scale, shrunk to one seed and a few steps per run."""
    p = compose(["family=all"])
    p["cls_runs"] = {k: {**p["cls_runs"][k], "seeds": [0]} for k in CLS_RUNS}
    p["gen_runs"] = {k: {**p["gen_runs"][k], "seeds": [0]} for k in GEN_RUNS}
    used = {r["model"] for r in [*p["cls_runs"].values(), *p["gen_runs"].values()]}
    p["models"] = {k: v for k, v in p["models"].items() if k in used or k.removesuffix("-published") in used}
    p["distributed"]["seed_processes"] = 1
    p["cls_shape"].update(depth=1, embed_dim=32)
    p["cls_recipe_overrides"].update(epochs=1, batch_size=256)
    p["gen_shape"].update(depth=1, hidden_size=32)
    p["gen_recipe"].update(steps=2, log_every=1, ckpt_every=2)
    p["sampling"].update(num_samples=70, batch_size=70, ddpm_steps=2, flow_steps=2)
    p["prepare_gen"]["extractor_epochs"] = 1
    p["attention_cost"].update(sides=[7, 14], min_run_time=0.02, batch=1)
    return p


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return reproduced_repo(tmp_path_factory.mktemp("family") / "repo", family_params())


@pytest.mark.slow
def test_every_family_member_and_control_trains_and_is_evaluated_on_both_branches(repo):
    for branch, runs, key in (("cls", CLS_RUNS, "top1"), ("gen", GEN_RUNS, "fid")):
        for run in runs:
            metrics = json.loads((repo / "runs" / branch / run / "metrics.json").read_text())
            assert key in metrics and math.isfinite(metrics[key]), (run, metrics)
    complexity = json.loads((repo / "metrics" / "complexity.json").read_text())
    assert {"deit_tiny-agent-published", "dit_s2-circulant", "deit_tiny-mhsa_dwc"} <= set(complexity)


@pytest.mark.slow
def test_the_report_fills_the_family_table_and_the_decomposition(repo):
    html = (repo / "reports" / "index.html").read_text()
    section = html[html.index("<h2>The attention family"):html.index("<h2>Classification runs")]
    table = section[:section.index("<h3>")]
    assert "not run" not in table and "dvc exp run -S family=all" not in table
    decomposition = section[section.index("<h3>"):]
    assert "not run" not in decomposition
    # five differences per branch, each of two one-seed runs: a value, but no interval and no sign
    assert decomposition.count('<td class="verdict one-seed:-no-error-estimate">one seed: no error estimate</td>') == 10
