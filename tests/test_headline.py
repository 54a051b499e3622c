"""The report stage's DVC metrics: one column per run in `dvc exp show`, named as short as stays unambiguous."""

from __future__ import annotations

import json

import yaml

from helpers import ROOT
from vcarepro.report.headline import HEADLINE, headline, headline_files, shared_prefix, write_headlines


def test_the_shared_prefix_is_whole_words_and_leaves_every_name_a_word():
    assert shared_prefix(["deit_tiny-mhsa", "deit_tiny-vca", "deit_tiny-vca-stage1_only"]) == "deit_tiny-"
    assert shared_prefix(["deit_tiny-vca-diff_both", "deit_tiny-vca-emb_both"]) == "deit_tiny-vca-"
    assert shared_prefix(["deit_tiny-vca", "deit_tiny-vca-emb_both"]) == "deit_tiny-"  # "vca" keeps a word
    assert shared_prefix(["dit_s2-mhsa", "sit_s2-vca"]) == ""
    assert shared_prefix(["deit_tiny-vca"]) == "deit_tiny-"
    assert shared_prefix(["mhsa"]) == shared_prefix([]) == ""


def test_a_run_without_a_current_result_has_no_column_value():
    metrics = {
        "deit_tiny-mhsa": {"top1": 71.5, "top1_std": 0.2},
        "deit_tiny-vca": None,
        "deit_tiny-vca-emb_both": {"top5": 90.0},
    }
    assert headline(["deit_tiny-mhsa", "deit_tiny-vca", "deit_tiny-vca-emb_both"], metrics, "top1") == {"mhsa": 71.5}


def test_names_that_would_meet_across_branches_stay_whole(tmp_path):
    cls = {"deit_tiny-mhsa": {"top1": 70.0}, "deit_tiny-vca": {"top1": 71.0}}
    gen = {"dit_s2-mhsa": {"fid": 40.0}, "dit_s2-vca": {"fid": 38.0}}
    files = headline_files({"cls_runs": list(cls), "gen_runs": list(gen)}, {"cls": cls, "gen": gen})
    assert files == {
        "metrics/cls_top1.json": {"deit_tiny-mhsa": 70.0, "deit_tiny-vca": 71.0},
        "metrics/gen_fid.json": {"dit_s2-mhsa": 40.0, "dit_s2-vca": 38.0},
    }
    gen = {"dit_s2-mhsa": {"fid": 40.0}, "sit_s2-vca": {"fid": 38.0}}
    files = headline_files({"cls_runs": list(cls), "gen_runs": list(gen)}, {"cls": cls, "gen": gen})
    assert files["metrics/cls_top1.json"] == {"mhsa": 70.0, "vca": 71.0}
    write_headlines(tmp_path, files)
    assert json.loads((tmp_path / "metrics" / "gen_fid.json").read_text()) == {"dit_s2-mhsa": 40.0, "sit_s2-vca": 38.0}


def test_the_headline_files_are_the_pipelines_only_metrics_and_every_other_number_is_an_output():
    """What makes `dvc exp show` a table of runs: any other declared metrics file adds a column per number per seed."""
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    declared = {
        (name, m if isinstance(m, str) else next(iter(m)))
        for name, stage in dvc.items()
        for m in stage.get("do", stage).get("metrics", [])
    }
    assert declared == {("report", path) for path, _ in HEADLINE.values()}
    outs = {o for stage in dvc.values() for o in stage.get("do", stage).get("outs", []) if isinstance(o, str)}
    for kept in (
        "runs/cls/${key}/metrics.json",
        "runs/gen/${key}/live/metrics.json",
        "metrics/complexity.json",
        "metrics/cls_reference.json",
        "metrics/calibration_cls.json",
    ):
        assert kept in outs
