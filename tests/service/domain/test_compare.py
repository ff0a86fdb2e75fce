"""The compare engine on synthetic sample sets whose truth is known."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.domain.compare import (
    MIB,
    CaseInfo,
    CompareConfig,
    JobRef,
    JobSide,
    SampleTable,
    compare,
    series_of,
    unit_bytes,
)
from workers import verdict as verdict_rule
from workers.suite import Metric

TIME = Metric("fwd_ms", "ms", "time")
MEM = Metric("peak_alloc", "bytes", "memory")
ACC = Metric("o_rel_l2", "", "accuracy", bound=1e-2)
TRAJ = Metric("loss_rel_err", "", "trajectory", bound=4e-4)
THROUGHPUT = Metric("tok_per_s", "tok/s", "time", direction="higher")
METRICS = {m.name: m for m in (TIME, MEM, ACC, TRAJ, THROUGHPUT)}


def side(
    records: list[tuple[str, str, int, int, float]],
    cases: dict[str, CaseInfo] | None = None,
    job_id: int = 1,
) -> JobSide:
    fps = {r[0] for r in records}
    cases = dict(cases or {})
    for fp in fps:
        cases.setdefault(fp, CaseInfo(fp, f"case-{fp}"))
    return JobSide(JobRef(job_id, "synthetic", "quick"), cases, METRICS, SampleTable.from_records(records))


def timing(fp: str, scale: float, noise: float, reps: int, seed: int, ranks: int = 1) -> list:
    rng = np.random.default_rng(seed)
    return [
        (fp, "fwd_ms", r, i, float(scale * (1 + noise * rng.standard_normal())))
        for r in range(ranks)
        for i in range(reps)
    ]


def one_time_verdict(slowdown: float, noise: float, reps: int, seed: int) -> tuple[str, object]:
    base = side(timing("c", 10.0, noise, reps, seed))
    head = side(timing("c", 10.0 * (1 + slowdown), noise, reps, seed + 1000), job_id=2)
    cmp = compare(base, head)
    (case,) = cmp.cases
    (m,) = case.metrics
    return m.verdict, m


@pytest.mark.parametrize("seed", range(10))
def test_ten_percent_slowdown_two_percent_noise_twenty_reps_regresses(seed: int) -> None:
    verdict, m = one_time_verdict(0.10, 0.02, 20, seed)
    assert verdict == "regressed", m.reason
    assert m.p_value is not None and m.p_value < 0.01
    assert 1.05 < m.ratio < 1.15
    assert m.ci_low <= m.ratio <= m.ci_high and m.ci_low > 1.0


@pytest.mark.parametrize("seed", range(10))
def test_ten_percent_speedup_improves(seed: int) -> None:
    verdict, m = one_time_verdict(-0.10, 0.02, 20, seed)
    assert verdict == "improved", m.reason


@pytest.mark.parametrize("seed", range(10))
def test_one_percent_change_is_unchanged(seed: int) -> None:
    verdict, m = one_time_verdict(0.01, 0.02, 20, seed)
    assert verdict == "unchanged", m.reason
    assert m.ci_low >= 0.95 and m.ci_high <= 1.05


@pytest.mark.parametrize("seed", range(10))
def test_three_noisy_reps_never_decide_a_change_beyond_the_min_effect(seed: int) -> None:
    # 3 vs 3 can never reach p < 0.01: a change beyond the minimum effect is inconclusive (the
    # gate measures again), one within it is unchanged; never regressed or improved
    verdict, m = one_time_verdict(0.10, 0.30, 3, seed)
    assert m.p_value is None
    assert verdict == ("inconclusive" if abs(m.ratio - 1) > 0.05 else "unchanged"), m.reason
    assert verdict_rule.min_two_sided_p(3, 3) == pytest.approx(0.1)


def test_min_effect_of_the_metric_is_honoured() -> None:
    # A significant 10% slow-down does not count for a metric that tolerates 20%.
    tolerant = Metric("fwd_ms", "ms", "time", min_effect=0.20)
    base = side(timing("c", 10.0, 0.02, 20, 1))
    head = side(timing("c", 11.0, 0.02, 20, 2))
    base.metrics = head.metrics = {"fwd_ms": tolerant}
    (m,) = compare(base, head).cases[0].metrics
    assert m.p_value < 0.01 and m.verdict != "regressed"


def test_higher_is_better_time_metric_regresses_when_it_drops() -> None:
    rng = np.random.default_rng(3)
    base = side([("c", "tok_per_s", 0, i, 100 * (1 + 0.02 * rng.standard_normal())) for i in range(20)])
    head = side([("c", "tok_per_s", 0, i, 80 * (1 + 0.02 * rng.standard_normal())) for i in range(20)])
    (m,) = compare(base, head).cases[0].metrics
    assert m.verdict == "regressed", m.reason


def test_worst_rank_is_taken_per_idx_before_statistics() -> None:
    # Rank 1 is 2x slower at every idx: the median must be rank 1's, not the mix of both ranks.
    recs = [("c", "fwd_ms", 0, i, 1.0 + i * 0.01) for i in range(5)]
    recs += [("c", "fwd_ms", 1, i, 2.0 + i * 0.01) for i in range(5)]
    recs += [("c", "tok_per_s", r, 0, 100.0 - 10 * r) for r in range(3)]
    series = series_of(SampleTable.from_records(recs), METRICS)
    got = {key: series.get(g)[1].tolist() for g, key in enumerate(series.keys)}
    assert got[("c", "fwd_ms")] == pytest.approx([2.0, 2.01, 2.02, 2.03, 2.04])
    assert got[("c", "tok_per_s")] == [80.0]  # higher is better: the worst rank is the minimum
    assert series.ranks == [2, 3]


def test_nan_on_one_rank_survives_the_reduction_and_fails() -> None:
    base = side(timing("c", 10.0, 0.01, 20, 1, ranks=2))
    recs = timing("c", 10.0, 0.01, 20, 2, ranks=2)
    recs[25] = ("c", "fwd_ms", 1, 5, float("nan"))
    (m,) = compare(base, side(recs)).cases[0].metrics
    assert m.verdict == "failed" and "idx 5" in m.reason


def test_memory_rules() -> None:
    def verdict(base_b: float, head_b: float, unit: str = "bytes") -> str:
        metric = Metric("peak_alloc", unit, "memory")
        b = side([("c", "peak_alloc", r, 0, base_b * (1 + r * 0.0)) for r in range(2)])
        h = side([("c", "peak_alloc", r, 0, head_b) for r in range(2)])
        b.metrics = h.metrics = {"peak_alloc": metric}
        return compare(b, h).cases[0].metrics[0].verdict

    assert verdict(100 * MIB, 120 * MIB) == "regressed"  # +20 MiB, +20%
    assert verdict(1024 * MIB, 1026 * MIB) == "unchanged"  # +2 MiB but only +0.2%
    assert verdict(10 * MIB, 10.5 * MIB) == "unchanged"  # +5% but only 0.5 MiB
    assert verdict(120 * MIB, 100 * MIB) == "improved"
    assert verdict(100.0, 120.0, unit="MiB") == "regressed"
    assert verdict(100.0, 100.9, unit="MiB") == "unchanged"
    assert verdict(0.90, 0.95, unit="x") == "regressed"  # a ratio of peaks: the relative rule only
    assert verdict(0.90, 0.905, unit="x") == "unchanged"
    assert unit_bytes("GiB") == 1024 * MIB
    with pytest.raises(ValueError, match="'ms' is not a byte unit"):
        unit_bytes("ms")


def test_accuracy_bound_and_growth() -> None:
    def result(base_v: float, head_v: float):
        b = side([("c", "o_rel_l2", 0, 0, base_v)])
        h = side([("c", "o_rel_l2", 0, 0, head_v)])
        return compare(b, h).cases[0]

    failed = result(5e-3, 2e-2)
    assert failed.verdict == "failed" and failed.metrics[0].bound_ok is False
    assert "breaks bound" in failed.metrics[0].reason
    assert result(1.5e-3, 4e-3).verdict == "worsened"  # 2.7x and above 10% of the bound
    assert result(1e-5, 5e-5).verdict == "unchanged"  # 5x but below the floor (1e-3 = bound/10)
    assert result(5e-3, 6e-3).verdict == "unchanged"
    assert result(6e-3, 2e-3).verdict == "improved"
    assert result(5e-3, float("nan")).verdict == "failed"


def test_trajectory_nan_fails_and_differences_are_evidence() -> None:
    steps = 50
    b = side([("t", "loss_rel_err", 0, s, 1e-4 + 1e-6 * s) for s in range(steps)])
    good = [("t", "loss_rel_err", 0, s, 1e-4 + 2e-6 * s) for s in range(steps)]
    (m,) = compare(b, side(good)).cases[0].metrics
    assert m.verdict == "unchanged", m.reason
    assert m.max_abs_diff == pytest.approx(49e-6)
    assert m.max_rel_diff == pytest.approx(49e-6 / (1e-4 + 49e-6))
    assert m.head.worst == pytest.approx(1e-4 + 98e-6)
    bad = list(good)
    bad[17] = ("t", "loss_rel_err", 0, 17, float("inf"))
    cmp = compare(b, side(bad))
    (m,) = cmp.cases[0].metrics
    assert m.verdict == "failed" and "idx 17" in m.reason
    assert not cmp.passed
    over = [("t", "loss_rel_err", 0, s, 1e-4 if s != 30 else 5e-4) for s in range(steps)]
    (m,) = compare(b, side(over)).cases[0].metrics
    assert m.verdict == "failed" and m.bound_ok is False


def test_added_removed_and_errored_cases_are_listed_and_errors_kept_out_of_statistics() -> None:
    base_recs = timing("same", 10, 0.02, 20, 1) + timing("gone", 10, 0.02, 20, 2)
    base_recs += timing("boom", 10, 0.02, 20, 3) + timing("baseboom", 10, 0.02, 20, 4)
    head_recs = timing("same", 10, 0.02, 20, 5) + timing("new", 10, 0.02, 20, 6)
    head_recs += [("boom", "fwd_ms", 0, i, 1000.0) for i in range(20)]  # partial samples before the error
    head_recs += [("baseboom", "o_rel_l2", 0, 0, 0.5)]
    base = side(base_recs, {"baseboom": CaseInfo("baseboom", "bb", status="error", error="RuntimeError: x")})
    head = side(
        head_recs,
        {
            "boom": CaseInfo("boom", "boom", status="error", error="Traceback...\nRuntimeError: CUDA OOM"),
            "empty": CaseInfo("empty", "empty", status="skipped"),
        },
    )
    cmp = compare(base, head)
    by = {c.fingerprint: c for c in cmp.cases}
    assert by["same"].verdict == "unchanged"
    assert by["new"].verdict == "added" and by["new"].base_status is None
    assert by["gone"].verdict == "removed" and by["gone"].head_status is None
    assert by["boom"].verdict == "errored" and by["boom"].metrics == []
    assert "CUDA OOM" in by["boom"].reason
    # base errored: no comparison, but the head's own bound still fails it
    assert by["baseboom"].verdict == "failed"
    assert by["empty"].verdict == "skipped"
    counts = cmp.counts()
    assert counts["added"] == 1 and counts["removed"] == 1 and counts["errored"] == 1
    assert {c.fingerprint for c in cmp.failing_cases()} == {"boom", "baseboom"}


def test_head_case_failed_status_fails_even_without_failing_metric() -> None:
    b = side(timing("c", 10, 0.02, 20, 1))
    failed = CaseInfo("c", "c", status="failed", error="token order wrong")
    h = side(timing("c", 10, 0.02, 20, 2), {"c": failed})
    (c,) = compare(b, h).cases
    assert c.verdict == "failed" and "token order" in c.reason


def test_results_are_deterministic_and_independent_of_other_cases() -> None:
    base = side(timing("a", 10, 0.05, 20, 1) + timing("b", 5, 0.05, 20, 2))
    head = side(timing("a", 10.4, 0.05, 20, 3) + timing("b", 5, 0.05, 20, 4))
    one = compare(base, head).to_dict()
    two = compare(base, head).to_dict()
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)
    alone = compare(side(timing("a", 10, 0.05, 20, 1)), side(timing("a", 10.4, 0.05, 20, 3)))
    a_full = next(c for c in one["cases"] if c["fingerprint"] == "a")["metrics"][0]
    a_alone = alone.cases[0].metrics[0]
    assert (a_full["ci_low"], a_full["ci_high"]) == (a_alone.ci_low, a_alone.ci_high)
    other_seed = compare(base, head, CompareConfig(seed=7)).to_dict()
    assert other_seed["cases"][0]["metrics"][0]["ci_low"] != a_full["ci_low"]


def test_to_dict_is_strict_json() -> None:
    b = side([("t", "loss_rel_err", 0, 0, 1e-4)])
    h = side([("t", "loss_rel_err", 0, 0, float("nan"))])
    text = json.dumps(compare(b, h).to_dict(), allow_nan=False)
    assert '"nan"' in text


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match=r"alpha=1\.5"):
        CompareConfig(alpha=1.5)
    with pytest.raises(ValueError, match="bootstrap=10"):
        CompareConfig(bootstrap=10)


def test_checks_fail_by_their_bound_only() -> None:
    bounded = Metric("triton_available", "bool", "check", "higher", bound=1.0)
    recorded = Metric("triton_available_recorded", "bool", "check", "higher")

    def verdict(metric: Metric, b: float, h: float) -> str:
        base = side([("c", metric.name, 0, 0, b)])
        head = side([("c", metric.name, 0, 0, h)])
        base.metrics = head.metrics = {metric.name: metric}
        return compare(base, head).cases[0].metrics[0].verdict

    assert verdict(bounded, 1.0, 0.0) == "failed"
    assert verdict(bounded, 1.0, 1.0) == "unchanged"
    assert verdict(recorded, 1.0, 0.0) == "changed"  # shown (recorded), but never fails a gate
    assert verdict(recorded, 0.0, 1.0) == "improved"
