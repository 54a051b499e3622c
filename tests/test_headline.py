"""Each run's DVC metric, written by its own evaluation: one column group per run in `dvc exp show`."""

from __future__ import annotations

import pytest
import yaml

from helpers import ROOT
from vcarepro.core.errors import BadInput
from vcarepro.metrics.aggregate import HEADLINE_KEY, aggregate_seeds, headline


def test_a_runs_headline_is_its_mean_spread_and_seed_count_under_its_whole_name():
    metrics = aggregate_seeds({0: {"top1": 70.0}, 1: {"top1": 72.0}, 2: {"top1": 74.0}}, ["top1"])
    assert headline("deit_tiny-vca", "cls", metrics) == {"deit_tiny-vca": {"top1": 72.0, "top1_std": 2.0, "n_seeds": 3}}
    fid = aggregate_seeds({0: {"fid": 40.0}, 1: {"fid": 38.0}}, ["fid"])
    assert headline("dit_s2-vca", "gen", fid)["dit_s2-vca"]["fid"] == 39.0


def test_one_seed_has_no_spread_to_show():
    metrics = aggregate_seeds({0: {"top1": 70.0}}, ["top1"])
    assert metrics["top1_std"] == 0.0  # aggregate_seeds writes 0 for one seed: the headline must not show it
    assert headline("deit_tiny-vca", "cls", metrics) == {"deit_tiny-vca": {"top1": 70.0, "n_seeds": 1}}


def test_a_run_without_its_number_fails_rather_than_writing_an_empty_metric():
    with pytest.raises(KeyError):
        headline("dit_s2-vca", "gen", aggregate_seeds({0: {"top1": 1.0}}, ["top1"]))
    with pytest.raises(BadInput):
        aggregate_seeds({}, ["top1"])


def test_each_evaluation_declares_its_runs_headline_the_pipelines_only_metrics():
    """What keeps an experiment's numbers its own: the report, which a targeted experiment does not run, declares no
    metric; any other declared metrics file would add a column per number per seed."""
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    declared = {
        (name, m if isinstance(m, str) else next(iter(m)))
        for name, stage in dvc.items()
        for m in stage.get("do", stage).get("metrics", [])
    }
    assert declared == {(f"eval_{b}", f"runs/{b}/${{key}}/headline.json") for b in HEADLINE_KEY}
    outs = {o for stage in dvc.values() for o in stage.get("do", stage).get("outs", []) if isinstance(o, str)}
    for kept in (
        "runs/cls/${key}/metrics.json",
        "runs/gen/${key}/live/metrics.json",
        "metrics/complexity.json",
        "metrics/cls_reference.json",
        "metrics/calibration_cls.json",
    ):
        assert kept in outs
