"""The verdict rule (workers.verdict): rank reduction, statistics, bounds, comparison thresholds,
case and job status — every kind and direction, non-finite samples, empty series, zero references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers import stats, verdict
from workers.suite import Metric

KINDS = ("time", "memory", "accuracy", "check", "trajectory")


@pytest.mark.parametrize("direction", ["lower", "higher"])
def test_worst_rank_per_idx_follows_the_direction(direction: str) -> None:
    rows = [(0, 0, 1.0), (1, 0, 3.0), (0, 1, 5.0), (1, 1, 2.0)]
    got = stats.reduce_ranks(rows, direction)
    assert got == ([3.0, 5.0] if direction == "lower" else [1.0, 2.0])


def test_one_rank_is_its_own_worst_and_idx_order_is_kept() -> None:
    assert stats.reduce_ranks([(0, 2, 7.0), (0, 0, 1.0), (0, 1, 4.0)], "lower") == [1.0, 4.0, 7.0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("direction", ["lower", "higher"])
def test_a_non_finite_value_on_any_rank_survives_the_reduction(bad: float, direction: str) -> None:
    got = stats.reduce_ranks([(0, 0, 1.0), (1, 0, bad)], direction)
    assert not math.isfinite(got[0])


@pytest.mark.parametrize("direction", ["lower", "higher"])
def test_statistics_count_non_finite_values_instead_of_dropping_them(direction: str) -> None:
    st = stats.summarise([1.0, 2.0, math.nan, 4.0, math.inf], direction)
    assert (st.count, st.nonfinite, st.min, st.max) == (5, 2, 1.0, 4.0)
    assert st.median == 2.0 and math.isnan(st.worst) and not st.finite
    arr = stats.summarise(np.array([1.0, 2.0, np.nan, 4.0, np.inf]), direction)
    assert (arr.count, arr.nonfinite, arr.median, arr.min, arr.max) == (5, 2, 2.0, 1.0, 4.0)


def test_statistics_are_numpys_definitions() -> None:
    values = np.random.default_rng(0).normal(10, 2, 37)
    st = stats.summarise(list(values), "lower")
    want = {"median": np.median(values), "p90": np.percentile(values, 90), "min": values.min(),
            "max": values.max(), "mean": values.mean(), "worst": values.max()}
    for f, v in want.items():
        assert getattr(st, f) == pytest.approx(v, rel=1e-12)


def test_an_empty_series_has_nothing_to_judge() -> None:
    st = stats.summarise([], "lower")
    assert st.count == 0 and math.isnan(st.median)
    j = verdict.judge("accuracy", "lower", 1e-2, st)
    assert j.ok is None and "no samples" in j.reason


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("direction", ["lower", "higher"])
def test_each_kind_is_judged_on_its_declared_statistic(kind: str, direction: str) -> None:
    # median 2, worst 10 (lower) or 0.5 (higher): a bound of 5 (lower) / 1 (higher) separates them
    values = [2.0, 2.0, 2.0, 10.0] if direction == "lower" else [2.0, 2.0, 2.0, 0.5]
    bound = 5.0 if direction == "lower" else 1.0
    st = stats.summarise(values, direction)
    j = verdict.judge(kind, direction, bound, st, "m")
    on_median = verdict.JUDGED_ON[kind] == "median"
    assert on_median == (kind == "time")
    assert j.ok is on_median  # the median holds the bound, the worst value breaks it
    assert j.value == (2.0 if on_median else values[-1])
    assert verdict.JUDGED_ON[kind] in j.reason


@pytest.mark.parametrize("kind", KINDS)
def test_non_finite_samples_fail_every_kind_with_or_without_a_bound(kind: str) -> None:
    st = stats.summarise([1.0, math.nan], "lower")
    assert verdict.judge(kind, "lower", None, st).ok is False
    assert verdict.judge(kind, "lower", 10.0, st).ok is False
    inf = stats.summarise([1.0, math.inf], "higher")
    assert verdict.judge(kind, "higher", None, inf).ok is False


def test_without_a_bound_a_finite_series_is_not_judged() -> None:
    j = verdict.judge("accuracy", "lower", None, stats.summarise([3.0], "lower"))
    assert j.ok is None and j.value == 3.0


def test_bound_edges_hold_and_metric_passes_uses_the_same_rule() -> None:
    assert verdict.bound_holds(1.0, 1.0, "lower") and verdict.bound_holds(1.0, 1.0, "higher")
    assert not verdict.bound_holds(math.nan, None, "lower")
    m = Metric("x", "", "accuracy", bound=1e-2)
    assert m.passes(1e-2) and not m.passes(1.1e-2) and not m.passes(math.inf)


def test_judge_samples_reduces_ranks_before_the_median() -> None:
    # rank 1 is slow in every repetition: the rank-max median is rank 1's, breaking the bound
    t = Metric("t", "ms", "time", bound=5.0)
    rows = [(0, i, 1.0) for i in range(5)] + [(1, i, 9.0) for i in range(5)]
    assert verdict.judge_samples(t, rows).ok is False
    assert verdict.judge_samples(t, [r for r in rows if r[0] == 0]).ok is True


def test_min_effect_per_kind_declared_and_on_cpu() -> None:
    assert verdict.min_effect("time", None) == verdict.MIN_EFFECT["time"]
    assert verdict.min_effect("memory", None) == verdict.MIN_EFFECT["memory"]
    assert verdict.min_effect("time", 0.02, "cuda") == 0.02
    # on cpu an undeclared time counts only from a doubling; a declared one is the metric's own
    assert verdict.min_effect("time", None, "cpu") == verdict.CPU_TIME_MIN_EFFECT == 1.0
    assert verdict.min_effect("time", 0.25, "cpu") == 0.25
    assert verdict.min_effect("accuracy", None, "cpu") == verdict.MIN_EFFECT["accuracy"]


def test_a_time_change_is_judged_symmetrically_in_the_ratio() -> None:
    # +100 %: a doubling is worse, a halving better, anything between is the same
    assert verdict.time_moved(2.01, 1.0, "lower") == "worse"
    assert verdict.time_moved(0.49, 1.0, "lower") == "better"
    assert verdict.time_moved(1.9, 1.0, "lower") == verdict.time_moved(0.55, 1.0, "lower") == "same"
    assert verdict.time_moved(1.3, 0.25, "higher") == "better"  # a higher-is-better rate grew
    assert verdict.time_moved(float("nan"), 0.05, "lower") == "unknown"


def test_significance_needs_five_repetitions_per_side_at_alpha_001() -> None:
    assert verdict.repeats_for_significance(0.01) == 5
    assert verdict.min_two_sided_p(4, 4) >= 0.01 > verdict.min_two_sided_p(5, 5)
    assert verdict.min_two_sided_p(0, 5) == 1.0


def test_relative_l2_against_a_zero_reference_is_the_absolute_norm() -> None:
    assert verdict.relative_l2(0.0, 0.0) == 0.0
    assert verdict.relative_l2(0.5, 0.0) == 0.5
    assert verdict.relative_l2(1.0, 4.0) == 0.25


def test_tensor_error_uses_the_same_zero_reference_rule() -> None:
    torch = pytest.importorskip("torch")
    from workers.measure import tensor_error

    zero = torch.zeros(3)
    assert tensor_error(zero, zero).rel_l2 == 0.0
    assert tensor_error(torch.tensor([3.0, 4.0, 0.0]), zero).rel_l2 == pytest.approx(5.0)


def test_case_status_ran_cleanly_but_a_bound_breaks() -> None:
    ok = verdict.Judgement(True, 1.0, "a within")
    bad = verdict.Judgement(False, 2.0, "b breaks bound")
    assert verdict.case_status(("passed", None), [ok]) == ("passed", None)
    assert verdict.case_status(("passed", None), [ok, bad]) == ("failed", "b breaks bound")
    assert verdict.case_status(("error", "tb"), [bad]) == ("error", "tb")  # how it ran comes first
    assert verdict.case_status(("expected_error", "E"), [bad]) == ("expected_error", "E")


def test_rank_statuses_worst_wins_and_names_the_rank() -> None:
    assert verdict.combine_rank_statuses({0: ("passed", None), 1: ("error", "tb")}) == ("error", "rank 1: tb")
    status, why = verdict.combine_rank_statuses({0: ("expected_error", "E"), 1: ("passed", None)})
    assert status == "failed" and "[0] only" in why


def test_job_verdict_from_case_statuses() -> None:
    assert verdict.job_verdict(["passed", "expected_error", "skipped"]).verdict == "passed"
    failed = verdict.job_verdict(["passed", "failed"])
    assert failed.verdict == "failed" and failed.counts["failed"] == 1
    errored = verdict.job_verdict(["passed", "failed", "error"])
    assert errored.verdict == "errored" and errored.summary() == "errored (1 error, 1 failed, 1 passed)"
    assert verdict.job_verdict(["passed"], ran=False).verdict == "errored"
    missing = verdict.job_verdict(["passed"], expected=3)
    assert missing.verdict == "errored" and missing.counts["not_run"] == 2
    assert verdict.job_verdict(["bogus"]).counts["error"] == 1
    assert verdict.job_verdict([]).verdict == "passed"
