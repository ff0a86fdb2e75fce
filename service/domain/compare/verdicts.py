"""One metric of a case against its bound and against the base, then a case from its metrics:
the engine's groups handed to the judgment (`service.domain.compare.judgment`, one function per
kind); the bound rule is `workers.verdict`'s. Nothing is judged here."""

from __future__ import annotations

import math

import numpy as np

from service.domain.compare import judgment
from service.domain.compare.judgment import Rule
from service.domain.compare.results import SEVERITY, CaseResult, MetricResult
from service.domain.compare.series import Series
from workers import verdict
from workers.stats import MetricStats


def first_line(text: str | None) -> str:
    return (text or "no error text").strip().splitlines()[-1][:200] if text else "no error text"


def settle_case(cr: CaseResult, in_base: bool, bstat: str | None) -> None:
    """Case verdict from its metrics: the most severe one; added / errored-base noted."""
    if cr.head_status == "failed" and not any(m.verdict == "failed" for m in cr.metrics):
        cr.verdict, cr.reason = "failed", f"head case failed: {first_line(cr.head_error)}"
        return
    worst = min(cr.metrics, key=lambda m: SEVERITY[m.verdict], default=None)
    if not in_base:
        if worst is not None and worst.verdict == "failed":
            cr.verdict, cr.reason = "failed", f"case only in head; {worst.metric}: {worst.reason}"
        else:
            cr.verdict, cr.reason = "added", "case only in head"
        return
    if bstat == "error":
        if worst is not None and worst.verdict == "failed":
            cr.verdict, cr.reason = "failed", f"{worst.metric}: {worst.reason}"
        else:
            cr.verdict, cr.reason = "errored", f"base run errored: {first_line(cr.base_error)}"
        return
    if worst is None:
        cr.verdict, cr.reason = "unchanged", "no samples on either side"
        return
    cr.verdict = worst.verdict
    cr.reason = f"{worst.metric}: {worst.reason}"
    if cr.head_status == "failed" and cr.head_error:  # the suite's own words for the failure
        cr.reason += f" ({first_line(cr.head_error)})"


def metric_result(
    rule: Rule,
    bser: Series,
    bsums: list[MetricStats],
    bg: int | None,
    hser: Series,
    hsums: list[MetricStats],
    hg: int | None,
    pending: dict[tuple[int, int], list[tuple[MetricResult, int, int]]],
    reference: float | None = None,
    reference_job: int | None = None,
) -> MetricResult:
    """`reference`: the reference backend's worst value of this metric on the same case in the
    head job (`judgment.reference_case_params`), for an accuracy change; None where there is none.
    `reference_job`: the job that measured that case, when the head job took it from one."""
    metric = rule.metric
    kind = metric.kind
    h = hsums[hg] if hg is not None else None
    b = bsums[bg] if bg is not None else None
    mr = MetricResult(metric.name, kind, metric.unit, metric.direction, metric.bound, "unchanged", "", b, h,
                      diagnostic=rule.diagnostic)
    if h is None:
        mr.verdict, mr.reason = "removed", "metric only in base"
        return mr
    if b is not None:
        mr.delta, mr.rel_delta, mr.ratio = _deltas(b, h, kind == "time")
        if kind == "trajectory":
            _set_trajectory_diffs(mr, *bser.get(bg), *hser.get(hg))  # type: ignore[arg-type]

    # The head against the bound (workers.verdict: non-finite fails every kind; the judged
    # statistic per kind). Most metrics have no bound: the rule is called only for those that do.
    if rule.diagnostic:  # recorded and shown, never judged: no bound, no failure, no claim
        if b is None:
            mr.verdict, mr.reason = "added", "metric only in head (diagnostic)"
        else:
            mr.verdict, mr.reason = judgment.recorded_change(b.worst, h.worst, rule)
        return mr
    if h.nonfinite:
        mr.bound_ok = False if metric.bound is not None else None
        mr.verdict = "failed"
        mr.reason = f"non-finite value at idx {h.first_nonfinite_idx}"
        return mr
    if metric.bound is not None and rule.not_judged is None:
        value = h.median if rule.judged_on_median else h.worst
        mr.bound_ok = verdict.bound_holds(value, metric.bound, metric.direction)
        if not mr.bound_ok:
            judged = verdict.judge(kind, metric.direction, metric.bound, h)
            mr.verdict, mr.reason = "failed", judged.reason
            return mr
    if b is None:
        mr.verdict, mr.reason = "added", "metric only in head"
        return mr
    if b.nonfinite:
        mr.verdict, mr.reason = "improved", "base had non-finite values, head is finite"
        return mr

    if kind == "time" and metric.repeated:
        if b.median <= 0 or h.median <= 0:
            mr.verdict, mr.reason = "changed", "non-positive median time, ratio undefined (recorded)"
            return mr
        assert bg is not None and hg is not None
        pending.setdefault((b.count, h.count), []).append((mr, bg, hg))
        return mr
    if kind == "memory":
        mr.verdict, mr.reason = judgment.memory_change(b.worst, h.worst, rule)
    elif kind == "check":
        mr.verdict, mr.reason = judgment.recorded_change(b.worst, h.worst, rule)
    elif kind == "time":  # a one-value time metric (not repeated)
        mr.verdict, mr.reason = judgment.recorded_change(b.median, h.median, rule)
    else:
        mr.verdict, mr.reason = judgment.accuracy_change(b.worst, h.worst, rule, reference, reference_job)
    return mr


def _deltas(
    base: MetricStats, head: MetricStats, is_time: bool
) -> tuple[float | None, float | None, float | None]:
    """(delta, relative delta, ratio) of the compared statistic: the median for time (whose ratio
    is the batched statistics' ratio of medians, so None here), else the worst value; none when
    either side has a non-finite value."""
    b, h = (base.median, head.median) if is_time else (base.worst, head.worst)
    if base.nonfinite or head.nonfinite or not (math.isfinite(b) and math.isfinite(h)):
        return None, None, None
    delta = h - b
    if b == 0:
        return delta, None, None
    return delta, delta / abs(b), None if is_time else h / b


def _set_trajectory_diffs(mr: MetricResult, bidx: np.ndarray, bvals: np.ndarray, hidx: np.ndarray,
                          hvals: np.ndarray) -> None:
    common, bi, hi = np.intersect1d(bidx, hidx, assume_unique=True, return_indices=True)
    if len(common) == 0:
        return
    diff = np.abs(hvals[hi] - bvals[bi])
    with np.errstate(all="ignore"):
        rel = diff / np.abs(bvals[bi])
        rel = np.where(diff == 0, 0.0, rel)
    mr.max_abs_diff = float(np.max(diff))
    mr.max_rel_diff = float(np.max(rel))
