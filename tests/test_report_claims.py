"""The report's typed pieces: the compute claims read from their table of tests, the rows' shapes and exports,
Holm's correction over a table's rows."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import ROOT
from vcarepro.metrics.intervals import welch
from vcarepro.report.claims import (
    ADDED_BELOW,
    CLAIM_TESTS,
    DOES_NOT_HOLD,
    HOLDS,
    NOT_CHECKED,
    NOT_RUN,
    ClaimTest,
    Measurements,
    check,
)
from vcarepro.report.family import Count, FamilyDifference, FamilyMetric, FamilyRow, Published
from vcarepro.report.gains import AblationGainRow, GainRow
from vcarepro.report.holm import SIGN, UNJUDGED, Comparison, Judgement, judge
from vcarepro.report.reference import PaperValue, load_reference
from vcarepro.report.verdicts import Cell, Measured

PARAMS = {"claim": "VCA adds fewer than 0.3M parameters to DeiT-T", "source": "A", "paper": "< +0.3M"}
FLOPS = {"claim": "VCA adds no FLOPs", "source": "A", "paper": "+0 GMACs"}
LINEAR = {"claim": "complexity O(N n C) with n << N", "source": "A", "paper": "linear in N"}


def counts(base_params, vca_params, base_gmacs=1.254, vca_gmacs=1.257):
    return Measurements(
        {
            "deit_tiny-mhsa": {"params_m": base_params, "gmacs": base_gmacs},
            "deit_tiny-vca": {"params_m": vca_params, "gmacs": vca_gmacs},
        }
    )


def macs(vca_3136, mhsa_3136=25600):
    return Measurements(
        {},
        {
            "config": {},
            "rows": [
                {"layer": "mhsa", "tokens": 196, "macs": 100},
                {"layer": "mhsa", "tokens": 3136, "macs": mhsa_3136},
                {"layer": "vca", "tokens": 196, "macs": 100},
                {"layer": "vca", "tokens": 3136, "macs": vca_3136},
            ],
        },
    )


def test_every_claim_of_the_paper_reference_has_its_test():
    claims = load_reference(ROOT / "data" / "paper_reference.yaml")["claims"]
    # a claim reworded in data/paper_reference.yaml without its test would silently read "not checked here"
    assert sorted(c["claim"] for c in claims) == sorted(t.wording for t in CLAIM_TESTS)


def test_a_claim_the_measurements_support_holds():
    row = check(PARAMS, counts(5.717, 5.974))
    assert (row.verdict, row.verdict_class, row.command) == (HOLDS, "holds", None)
    assert row.evidence == "+257.0K parameters on DeiT-T" and "fewer than 0.3M" in row.tolerance
    flops = check(FLOPS, counts(5.717, 5.974))  # 1.254 and 1.257 GMACs: both 1.3 as the paper prints them
    assert flops.verdict == HOLDS and flops.evidence == "1.2540 -> 1.2570 GMACs on DeiT-T at 224 px (+0.24%)"
    linear = check(LINEAR, macs(1600))
    assert linear.verdict == HOLDS and "VCA MACs 16.0x, MHSA 256.0x" in linear.evidence and linear.timing is None


def test_a_claim_the_measurements_contradict_does_not_hold():
    assert check(PARAMS, counts(5.717, 6.017)).verdict == DOES_NOT_HOLD  # +0.3M exactly: not fewer
    assert check(FLOPS, counts(5.7, 5.9, 1.254, 1.357)).verdict == DOES_NOT_HOLD  # 1.3 against 1.4
    quadratic = check(LINEAR, macs(25600))  # VCA's MACs grow as MHSA's: faster than the tokens
    assert quadratic.verdict == DOES_NOT_HOLD and quadratic.verdict_class == "does-not-hold"


def test_a_claim_whose_stage_did_not_run_says_which_stage_measures_it():
    row = check(PARAMS, Measurements({"deit_tiny-mhsa": {"params_m": 5.7, "gmacs": 1.2}}))  # VCA not counted
    assert (row.verdict, row.command) == (NOT_RUN, "dvc repro complexity")
    assert row.evidence == "not measured in this workspace: dvc repro complexity" and row.tolerance is None
    assert check(LINEAR, Measurements({})).command == "dvc repro attention_cost"


def test_a_claim_no_test_answers_or_its_output_cannot_decide_is_not_checked():
    row = check({"claim": "VCA is faster on a phone", "source": "A"}, counts(5.7, 5.9))
    assert (row.verdict, row.evidence, row.command) == (NOT_CHECKED, "not measured by this pipeline", None)
    one_side = Measurements({}, {"rows": [{"layer": "vca", "tokens": 196, "macs": 1}]})
    row = check(LINEAR, one_side)
    assert row.verdict == NOT_CHECKED and row.evidence == "VCA and MHSA were not both measured (attention_cost.layers)"


def test_the_table_not_the_wording_decides_what_a_claim_tests():
    # the same rule, another pair of models and limit: the interpreter reads only the table
    small = ClaimTest(
        wording="VCA adds fewer than 0.1M parameters to DeiT-S",
        stage="complexity",
        quantity="params_m",
        baseline="deit_small-mhsa",
        vca="deit_small-vca",
        rule=ADDED_BELOW,
        limit=0.1,
        on="DeiT-S",
        tolerance="fewer than 0.1M",
    )
    m = Measurements({"deit_small-mhsa": {"params_m": 22.0}, "deit_small-vca": {"params_m": 22.2}})
    row = check({"claim": small.wording, "source": "A"}, m, tests=(small,))
    assert row.verdict == DOES_NOT_HOLD and row.evidence == "+200.0K parameters on DeiT-S"
    assert check(PARAMS, m, tests=(small,)).verdict == NOT_CHECKED


def test_the_claims_export_keeps_its_columns_and_leaves_the_command_out():
    row = check(PARAMS, Measurements({}))
    assert list(row.as_dict()) == [
        "claim",
        "source",
        "paper",
        "evidence",
        "verdict",
        "verdict_class",
        "tolerance",
        "timing",
    ]


def test_a_shown_cell_is_frozen_text_and_exports_the_keys_the_csv_reads():
    cell = Cell(
        PaperValue(75.6, "A"),
        Measured(88.25, 1.5, 2, "embedded"),
        "not comparable",
        conflict=PaperValue(75.4, "N", verified=False),
        statistic="final epoch",
        flags=("x seed 1: flag",),
    )
    shown = cell.shown()
    assert (shown.paper, shown.ours, shown.diff, shown.conflict) == ("75.6", "88.2 ± 1.5 (n=2)", None, ("75.4", "N"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        shown.verdict = "reproduced"
    record = shown.as_dict()
    assert list(record) == [
        "paper",
        "source",
        "unverified",
        "conflict",
        "ours",
        "scale",
        "diff",
        "verdict",
        "verdict_class",
        "statistic",
        "reason",
        "stale",
        "flags",
    ]
    assert record["flags"] == ["x seed 1: flag"] and record["verdict_class"] == "not-comparable"


def difference(n=3, mean=1.0):
    return welch([mean + i * 0.1 for i in range(n)], [i * 0.1 for i in range(n)])


def gain(model, **fields):
    values = dict(
        table="Table 1",
        model=model,
        metric="top1",
        label=model,
        paper_value=None,
        ours_value=None,
        ours_low=None,
        ours_high=None,
        paper=None,
        source=None,
        ours=None,
        scale=None,
        unverified=False,
        direction=None,
        seeds_note=None,
        p_holm=None,
        stale=None,
        flags=(),
        comparable=False,
    )
    return GainRow(**{**values, **fields})


def test_holm_judges_each_row_and_counts_a_comparison_shown_twice_once():
    rows = [gain("A"), gain("B"), gain("C")]
    same = Comparison(difference(), None, SIGN, pair=("top1", "a", "top1", "b"))
    judged, m = judge(rows, [(same,), (same,), (None,)])
    assert m == 1 and judged[0].direction == judged[1].direction == "positive (resolved)"
    assert judged[0].p_holm == judged[1].p_holm is not None
    assert (judged[2].direction, judged[2].seeds_note, judged[2].p_holm) == (None, None, None)  # no test
    assert rows[0].direction is None  # the rows are frozen: judging makes new ones


def test_an_ablation_gain_exports_its_runs_last_and_keeps_its_type_when_judged():
    row = AblationGainRow(**vars(gain("Stage I only")), runs="deit_tiny-vca-stage1_only − deit_tiny-vca")
    assert list(row.as_dict())[-2:] == ["comparable", "runs"] and "runs" not in gain("x").as_dict()
    judged = row.judged(Judgement("stale: re-run dvc repro eval_cls@x"))
    assert isinstance(judged, AblationGainRow) and judged.direction.startswith("stale")


def test_a_family_row_exports_the_flat_columns_of_the_family_table():
    none = FamilyDifference(None, None, None, None, ())
    metric = FamilyMetric("90.0", "embedded", (), None, None, none, FamilyDifference("+1.00", None, None, None, ("s",)))
    row = FamilyRow(
        "agent",
        "Agent",
        "cite",
        "agent_deit_tiny",
        "deit_tiny-agent",
        "dit_s2-agent",
        Published("74.9", "M", False),
        Published("6.0", "M", True),
        Published(None, None, False),
        Count("6.02", "matches paper", "6.02"),
        Count(None, None, "1.17"),
        metric,
        metric,
    )
    row = row.judged(UNJUDGED, Judgement("positive (resolved)", None, "0.010"), UNJUDGED, UNJUDGED)
    record = row.as_dict()
    assert list(record)[:12] == [
        "attention",
        "label",
        "cite",
        "published_model",
        "cls_run",
        "gen_run",
        "published_top1",
        "published_top1_source",
        "published_top1_unverified",
        "published_params_m",
        "published_params_m_source",
        "published_params_m_unverified",
    ]
    assert list(record)[15:21] == [
        "ours_published_params_m",
        "ours_published_params_m_verdict",
        "dropin_params_m",
        "ours_published_gmacs",
        "ours_published_gmacs_verdict",
        "dropin_gmacs",
    ]
    assert list(record)[21:31] == [
        "top1",
        "top1_scale",
        "top1_flags",
        "top1_stale",
        "top1_stale_detail",
        "top1_vs_mhsa",
        "top1_vs_mhsa_verdict",
        "top1_vs_mhsa_note",
        "top1_vs_mhsa_p_holm",
        "top1_vs_mhsa_flags",
    ]
    assert len(record) == 21 + 2 * 15 and record["fid_vca_minus_flags"] == ["s"]
    assert (record["top1_vca_minus_verdict"], record["top1_vca_minus_p_holm"]) == ("positive (resolved)", "0.010")
    assert record["fid_vca_minus_verdict"] is None  # the FID judgement was UNJUDGED
