"""Differences between runs: Welch's interval, and a direction only where the interval supports one."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from vcarepro.metrics.intervals import (
    NO_PAPER_CHANGE,
    ONE_SEED,
    OPPOSITE,
    SAME,
    direction,
    not_resolved,
    seeds_note,
    welch,
)

# Welch's own kind of example: unequal sizes and spreads
A = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
B = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4, 21.0]


def test_welch_interval_equals_scipys_unequal_variance_t_interval():
    ours = welch(A, B)
    theirs = stats.ttest_ind(A, B, equal_var=False).confidence_interval(0.95)
    assert ours.low == pytest.approx(theirs.low, rel=1e-10) and ours.high == pytest.approx(theirs.high, rel=1e-10)
    assert ours.value == pytest.approx(sum(A) / len(A) - sum(B) / len(B))
    assert ours.resolved and ours.high < 0  # this example's difference is resolved, negative
    assert "95% Welch, n=15 vs 16" in ours.text()


def test_one_seed_on_a_side_has_no_interval_and_never_a_direction():
    diff = welch([80.0], [70.0, 71.0, 72.0])
    assert not diff.has_interval and not diff.resolved
    assert direction(diff, paper_gain=3.4) == ONE_SEED
    assert "one seed" in diff.text() and "[" not in diff.text()
    assert seeds_note(diff) is None


def test_an_interval_that_holds_zero_gets_no_direction_however_the_means_fall():
    # DiT-S/2 of the issue: a mean gain of the paper's sign whose interval holds zero
    base, vca = [60.0, 61.5, 59.0], [60.2, 58.1, 61.0]
    diff = welch(vca, base)
    assert diff.low < 0 < diff.high
    assert direction(diff, paper_gain=-6.1) == not_resolved(3) == "not resolved with 3 seeds"
    assert direction(diff, paper_gain=+6.1) == "not resolved with 3 seeds"


@pytest.mark.parametrize("paper_gain, expected", [(3.4, SAME), (-3.4, OPPOSITE), (0.0, NO_PAPER_CHANGE)])
def test_a_resolved_difference_is_compared_with_the_papers_sign(paper_gain, expected):
    diff = welch([90.0, 91.0, 92.0], [80.0, 81.0, 82.0])
    assert diff.resolved and diff.low > 0
    assert direction(diff, paper_gain) == expected


def test_seeds_needed_is_the_smallest_count_whose_interval_would_exclude_the_observed_difference():
    diff = welch([1.0, 3.0, 2.0], [1.5, 0.0, 2.0])  # +0.83, spreads 1.0 and 1.04: not resolved with 3
    assert not diff.resolved
    n = diff.seeds_to_resolve()

    def half_width(k):
        df = (diff.sd_a**2 / k + diff.sd_b**2 / k) ** 2 / (
            (diff.sd_a**2 / k) ** 2 / (k - 1) + (diff.sd_b**2 / k) ** 2 / (k - 1)
        )
        return stats.t.ppf(0.975, df) * math.sqrt((diff.sd_a**2 + diff.sd_b**2) / k)

    assert half_width(n) < abs(diff.value) <= half_width(n - 1)
    assert seeds_note(diff) == (
        f"rough: about {n} seeds per run if the observed difference and spread held "
        "(not a power calculation; before any correction)"
    )


def test_no_observed_difference_is_never_resolvable_by_more_seeds():
    diff = welch([1.0, 2.0], [2.0, 1.0])
    assert diff.value == 0 and not diff.resolved
    assert "would not give it a direction" in seeds_note(diff)
    # equal means that rounding makes -1.4e-14 apart are equal, not "more than 1000 seeds" away
    diff = welch(
        [95.0, 94.16666666666667, 89.16666666666667], [91.66666666666667, 93.33333333333333, 93.33333333333333]
    )
    assert diff.value == 0.0 and diff.text().startswith("+0.00 [")
    assert "would not give it a direction" in seeds_note(diff)


def test_per_seed_values_read_back_what_aggregate_seeds_wrote_in_seed_order():
    from vcarepro.metrics.aggregate import aggregate_seeds, per_seed_values

    metrics = aggregate_seeds({10: {"top1": 3.0}, 2: {"top1": 1.0}, 0: {"top1": 2.0}}, ["top1"])
    metrics["top1_seedless"] = 9.0  # a key that only starts like a seed key
    assert per_seed_values(metrics, "top1") == [2.0, 1.0, 3.0]  # seeds 0, 2, 10: numeric, not text, order
    assert per_seed_values(metrics, "top5") == []


def test_the_welch_p_value_is_below_five_percent_exactly_when_the_interval_excludes_zero():
    for a, b in (
        ([1.0, 3.0, 2.0], [1.5, 0.0, 2.0]),
        ([10.0, 11.0, 12.0], [1.0, 2.0, 3.0]),
        ([87.2, 89.3], [58.0, 62.0]),
        ([5.0, 5.1], [5.05, 4.95, 5.0]),
    ):
        diff = welch(a, b)
        assert (diff.p_value < 0.05) == diff.resolved
        assert diff.p_value == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)  # scipy's Welch test
    assert welch([1.0], [2.0, 3.0]).p_value is None  # one seed: no test


def test_holm_keeps_the_familywise_error_and_steps_down():
    from vcarepro.metrics.intervals import holm, holm_adjusted

    # m = 4: thresholds 0.0125, 0.0167, 0.025, 0.05 for the sorted p-values
    assert holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm([0.01, 0.016, 0.024, 0.049]) == [True, True, True, True]
    assert holm([0.02, 0.001, None]) == [True, True, None]  # None takes no part: m = 2
    assert holm([0.03, 0.04]) == [False, False]  # each below 0.05 alone, neither after the correction
    assert holm_adjusted([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjusted([0.5, 0.9, None]) == [1.0, 1.0, None]


def test_a_difference_resolved_alone_but_not_after_holm_gets_no_direction():
    diff = welch([10.0, 12.0, 11.0], [8.0, 9.5, 9.0])
    assert diff.resolved and 0.01 < diff.p_value < 0.05
    assert direction(diff, paper_gain=3.4) == "same direction as paper (resolved)"
    assert direction(diff, paper_gain=3.4, resolved=False) == not_resolved(3)
    assert "not after Holm's correction" in seeds_note(diff, resolved=False)
