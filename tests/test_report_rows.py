"""report/rows.py: which run answers a paper row, read how, over which seeds; one rule for the report and the card."""

from __future__ import annotations

import pytest

from helpers import ROOT
from vcarepro.params.config import compose
from vcarepro.report.card import run_rows
from vcarepro.report.reference import load_reference
from vcarepro.report.rows import STATISTICS, answering_run, paper_rows, seed_values
from vcarepro.report.workspace import Workspace


@pytest.fixture(scope="module")
def reference():
    return load_reference(ROOT / "data" / "paper_reference.yaml")


@pytest.fixture(scope="module")
def scales():
    return {
        scale: compose([f"scale={scale}"], config_dir=ROOT / "conf")
        for scale in ("embedded", "proxy", "smoke", "paper")
    }


def test_a_run_this_scale_trains_answers_its_own_row(scales, reference):
    embedded, paper = scales["embedded"], scales["paper"]
    assert answering_run("deit_tiny-vca", embedded, paper, reference) == "deit_tiny-vca"
    assert answering_run("deit_tiny-mhsa", embedded, paper, reference) == "deit_tiny-mhsa"
    # a run of this scale answers for itself even where the paper's matrix does not hold it (the ablations)
    assert answering_run("deit_tiny-vca-stage1_only", embedded, {}, reference) == "deit_tiny-vca-stage1_only"


def test_the_lab_recipe_twin_is_answered_by_the_baseline_where_the_recipes_collapse(scales, reference):
    embedded, paper = scales["embedded"], scales["paper"]
    assert "deit_tiny-mhsa-lab" not in embedded["cls_runs"]
    # embedded scale: the original and the lab's DeiT-T recipe resolve to the same one, so the baseline run
    # trains exactly what the twin would
    assert answering_run("deit_tiny-mhsa-lab", embedded, paper, reference) == "deit_tiny-mhsa"
    # proxy scale trains its DeiT-T baseline with the lab's recipe: the same model and recipe as the twin
    assert scales["proxy"]["cls_runs"]["deit_tiny-mhsa"]["recipe"] == "lab_deit_tiny"
    assert answering_run("deit_tiny-mhsa-lab", scales["proxy"], paper, reference) == "deit_tiny-mhsa"


def test_nothing_stands_in_where_the_recipes_differ_or_the_run_is_unknown(scales, reference):
    smoke, paper = scales["smoke"], scales["paper"]
    # smoke scale trains the baseline with DeiT's own recipe, which differs there from the lab's: the
    # original-recipe baseline does not stand in for the lab-recipe twin (the card once said it did)
    assert "deit_tiny-mhsa-lab" not in smoke["cls_runs"] and smoke["cls_runs"]["deit_tiny-mhsa"]["recipe"] == "deit"
    assert answering_run("deit_tiny-mhsa-lab", smoke, paper, reference) is None
    # nor the lab's class-token-free control (same recipe, another model) for PVT-T's twin
    assert answering_run("pvt_tiny-mhsa-lab", smoke, paper, reference) is None
    # another backbone's twin is never answered by a DeiT run
    assert answering_run("swin_tiny-mhsa-lab", scales["embedded"], paper, reference) is None
    # a run of no matrix, or the paper's matrix unknown: no answer
    assert answering_run("nope", scales["embedded"], paper, reference) is None
    assert answering_run("deit_tiny-mhsa-lab", scales["embedded"], {}, reference) is None


def test_the_report_tables_use_the_same_rule(scales, reference):
    embedded, paper = scales["embedded"], scales["paper"]
    ws = Workspace(reference, embedded, {}, {}, {}, cls_comparable=False, gen_comparable=False, paper_params=paper)
    assert ws.same_run("deit_tiny-mhsa-lab") == "deit_tiny-mhsa"  # Table 1's "same as" column
    assert ws.same_run("deit_tiny-mhsa") is None  # trained here: no stand-in to name
    assert ws.run_used("deit_tiny-mhsa-lab") == "deit_tiny-mhsa"
    assert (
        Workspace(
            reference, scales["smoke"], {}, {}, {}, cls_comparable=False, gen_comparable=False, paper_params=paper
        ).same_run("deit_tiny-mhsa-lab")
        is None
    )


def test_seed_values_are_the_per_seed_figures_in_seed_order_or_the_single_mean():
    metrics = {"top1": 2.0, "top1_seed10": 3.0, "top1_seed2": 1.0, "top1_std": 1.4, "top5": 7}
    assert seed_values(metrics, "top1") == (1.0, 3.0)
    assert seed_values(metrics, "top5") == (7.0,)
    assert seed_values(metrics, "top1_best") == ()


def test_paper_rows_cover_tables_1_3_4_and_the_family_with_the_run_compared_with(reference):
    rows = list(paper_rows(reference))
    titles = {reference[k]["title"] for k in ("table1", "table3", "table4", "family")}
    assert {r["table"] for r in rows} == titles
    vca = [r for r in rows if r["table"] == reference["table1"]["title"] and r["run"] == "deit_tiny-vca"]
    assert len(vca) == 1 and vca[0]["baseline_run"] == "deit_tiny-mhsa" and vca[0]["statistic"] == "best"
    baseline = next(r for r in rows if r["run"] == "deit_tiny-mhsa")
    assert baseline["baseline_run"] is None and baseline["baseline_top1"] is None  # compared with itself
    agent = next(r for r in rows if r["run"] == "deit_tiny-agent")
    assert agent["baseline_run"] == reference["family"]["baseline"]["cls_run"] and agent["statistic"] == "unknown"
    assert all(r["statistic"] is None or r["statistic"] in STATISTICS for r in rows)
    # the card lists the rows that name its run, in the tables' order
    assert [r["table"] for r in run_rows(reference, "deit_tiny-vca")] == [
        reference["table1"]["title"],
        reference["table3"]["title"],
        reference["table4"]["title"],
    ]
