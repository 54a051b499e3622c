"""The attention family through the real `dvc repro`: every member and control on both branches."""

from __future__ import annotations

import json
import math

import pytest

from helpers import micro_params, reproduced_repo
from vcarepro.core.choices import FAMILY

MEMBERS = [*FAMILY, "mhsa_dwc", "vca-no_dwc"]
CLS_RUNS = ["deit_tiny-mhsa", "deit_tiny-vca", *(f"deit_tiny-{m}" for m in MEMBERS)]
GEN_RUNS = ["dit_s2-mhsa", "dit_s2-vca", *(f"dit_s2-{m}" for m in MEMBERS)]


def family_params() -> dict:
    """`family=all` at the embedded scale, shrunk like test_pipeline's runs, with fewer steps (14 more runs)."""
    p = micro_params(["family=all"], CLS_RUNS, GEN_RUNS)
    p["distributed"]["seed_processes"] = 1
    p["gen_recipe"].update(steps=2, log_every=1)
    p["sampling"].update(ddpm_steps=2, flow_steps=2)
    p["attention_cost"].update(min_run_time=0.02, batch=1)
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
    section = html[html.index("<h2>The attention family") : html.index('<h2 id="runs">Classification runs')]
    assert 'class="folded"' not in section and "dvc exp run -S family=all" not in section  # every row was run
    ours = section[section.index("<h3>Our runs</h3>") : section.index("<h3>Where VCA")]
    assert ours.count("<tr>") == 1 + 7  # header, MHSA, VCA and the five members
    decomposition = section[section.index("<h3>Where VCA") :]
    # five differences per branch, each of two one-seed runs: a value, but no interval and no sign
    assert decomposition.count('<td class="verdict one-seed:-no-error-estimate">one seed: no error estimate</td>') == 10
