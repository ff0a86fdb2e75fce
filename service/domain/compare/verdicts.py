"""The verdicts: one metric of a case against its bound and against the base (per kind: time,
memory, accuracy and trajectory, checks), then a case from its metrics. The rule itself is
`workers.verdict`'s; this module applies it to the engine's groups."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from service.domain.compare.config import MIB, UNIT_BYTES, CompareConfig, unit_bytes
from service.domain.compare.results import SEVERITY, CaseResult, MetricResult, Verdict
from service.domain.compare.series import Series
from workers import verdict
from workers.stats import MetricStats
from workers.suite import Metric


@dataclass(frozen=True, slots=True)
class Rule:
    """What the rules need of one metric, worked out once per comparison instead of per case."""

    metric: Metric
    lower: bool  # lower is better
    judged_on_median: bool  # the bound's statistic (workers.verdict.JUDGED_ON)
    min_effect: float  # workers.verdict.min_effect for this metric on this device
    floor: float  # accuracy and trajectory: no 'worsened' at or below this absolute value
    memory_abs_bytes: float  # memory: no regression below this growth
    not_judged: str | None = None  # time: why it is shown but not judged (workers.verdict.time_not_judged)

    @classmethod
    def of(cls, metric: Metric, cfg: CompareConfig, device: str | None, same_code: bool = False) -> Rule:
        floor = cfg.accuracy_floor
        if metric.bound is not None:
            floor = max(floor, cfg.accuracy_floor_bound_frac * abs(metric.bound))
        return cls(
            metric,
            metric.direction != "higher",
            verdict.JUDGED_ON.get(metric.kind) == "median",
            verdict.min_effect(metric.kind, metric.min_effect, device),
            floor,
            cfg.memory_abs_bytes,
            verdict.time_not_judged(metric.min_effect, device, same_code) if metric.kind == "time" else None,
        )


def time_verdict(
    ratio: float, lo: float, hi: float, p: float, rule: Rule, cfg: CompareConfig
) -> tuple[Verdict, str]:
    """Significant and larger than the minimum effect -> regressed/improved; a change within the
    minimum effect -> unchanged; larger but not (yet) significant -> inconclusive, which the gate
    measures again until decided (it never passes a gate silently)."""
    eff = rule.min_effect
    moved = verdict.time_moved(ratio, eff, rule.metric.direction)
    testable = p == p
    significant = testable and p < cfg.alpha
    pct = f"{ratio - 1.0:+.1%}"
    ptxt = f"p={p:.2g}" if testable else "too few samples for significance"
    ci_txt = f"CI [{lo:.3f}, {hi:.3f}]"
    if rule.not_judged is not None:  # shown with its evidence, never a verdict that fails or waits
        if moved == "same":
            return "unchanged", f"median {pct} within ±{eff:.0%} ({ptxt}; not judged: {rule.not_judged})"
        return "changed", f"median {pct} ({ptxt}, {ci_txt}; recorded, not judged: {rule.not_judged})"
    if significant and moved in ("worse", "better"):
        why = f"median {pct} ({ptxt}, {ci_txt}; min effect {eff:.0%})"
        return ("regressed" if moved == "worse" else "improved"), why
    if moved == "same":
        return "unchanged", f"median {pct} within the min effect ±{eff:.0%} ({ptxt}, {ci_txt})"
    return "inconclusive", f"median {pct} exceeds ±{eff:.0%} but is not significant ({ptxt}, {ci_txt})"


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


def metric_result(
    rule: Rule,
    bser: Series,
    bsums: list[MetricStats],
    bg: int | None,
    hser: Series,
    hsums: list[MetricStats],
    hg: int | None,
    pending: dict[tuple[int, int], list[tuple[MetricResult, int, int]]],
) -> MetricResult:
    metric = rule.metric
    kind = metric.kind
    h = hsums[hg] if hg is not None else None
    b = bsums[bg] if bg is not None else None
    mr = MetricResult(metric.name, kind, metric.unit, metric.direction, metric.bound, "unchanged", "", b, h)
    if h is None:
        mr.verdict, mr.reason = "removed", "metric only in base"
        return mr
    if b is not None:
        mr.delta, mr.rel_delta, mr.ratio = _deltas(b, h, kind == "time")
        if kind == "trajectory":
            _set_trajectory_diffs(mr, *bser.get(bg), *hser.get(hg))  # type: ignore[arg-type]

    # The head against the bound (workers.verdict: non-finite fails every kind; the judged
    # statistic per kind). Most metrics have no bound: the rule is called only for those that do.
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
        _memory_verdict(mr, rule)
    elif kind in ("check", "time"):  # a check, or a one-value time metric (not repeated)
        _recorded_verdict(mr, rule)
    else:
        mr.verdict, mr.reason = _accuracy_verdict(mr.base.worst, mr.head.worst, rule)
    return mr


def _recorded_verdict(mr: MetricResult, rule: Rule) -> None:
    """A check, or a time metric with one value per case: judged only by its bound (above); a
    move beyond the kind's minimum effect is shown as `changed` (recorded, never a gate failure:
    for a derived ratio the metrics it derives from carry the verdict)."""
    assert mr.base is not None and mr.head is not None
    metric = rule.metric
    b, h = mr.base.worst, mr.head.worst
    if metric.kind == "time":
        b, h = mr.base.median, mr.head.median
    moved = verdict.classify_change(metric.kind, metric.direction, b, h, rule.min_effect)
    if moved == "same":
        mr.verdict, mr.reason = "unchanged", f"{h:g}" if b == h else f"{b:.4g} -> {h:.4g}"
    elif moved == "better":
        mr.verdict, mr.reason = "improved", f"{b:.4g} -> {h:.4g}"
    else:
        mr.verdict, mr.reason = "changed", f"{b:.4g} -> {h:.4g} (recorded, not judged)"


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


def _memory_verdict(mr: MetricResult, rule: Rule) -> None:
    """Bytes: more than the minimum effect (1 % by default) and more than 1 MiB. A memory metric
    in another unit (a ratio of two peaks) has no absolute scale: only the relative rule applies."""
    assert mr.base is not None and mr.head is not None
    metric = rule.metric
    b, h = mr.base.worst, mr.head.worst
    eff = rule.min_effect
    grow = (h - b) if metric.direction == "lower" else (b - h)
    rel = grow / abs(b) if b else (math.inf if grow > 0 else 0.0)
    if metric.unit.strip().lower() not in UNIT_BYTES:
        why = f"{b:.4g} -> {h:.4g} ({rel:+.1%}, {metric.unit or 'no unit'})"
        if rel > eff:
            mr.verdict, mr.reason = "regressed", why
        elif -rel > eff:
            mr.verdict, mr.reason = "improved", why
        else:
            mr.verdict, mr.reason = "unchanged", f"{b:.4g} -> {h:.4g} ({rel:+.1%}) within {eff:.0%}"
        return
    grow_bytes = grow * unit_bytes(metric.unit)
    mib = grow_bytes / MIB
    if grow_bytes > rule.memory_abs_bytes and rel > eff:
        mr.verdict, mr.reason = "regressed", f"grew {mib:+.2f} MiB ({rel:+.1%})"
    elif -grow_bytes > rule.memory_abs_bytes and -rel > eff:
        mr.verdict, mr.reason = "improved", f"shrank {mib:+.2f} MiB ({rel:+.1%})"
    else:
        mr.verdict, mr.reason = "unchanged", f"{mib:+.2f} MiB ({rel:+.1%}) within 1 MiB or {eff:.0%}"


def _accuracy_verdict(b: float, h: float, rule: Rule) -> tuple[Verdict, str]:
    """Worst values of base and head: worse or better only by more than the minimum effect
    (a factor, 2x by default) and above the absolute floor."""
    floor = rule.floor
    f = 1.0 + rule.min_effect
    if rule.lower:
        worse = h > f * b and h > floor
        better = b > f * h and b > floor
    else:
        worse = b > f * h and b > floor
        better = h > f * b and h > floor
    if worse:
        return "worsened", f"{b:.3g} -> {h:.3g} (more than {f:g}x, above floor {floor:.1g})"
    if better:
        return "improved", f"{b:.3g} -> {h:.3g} (more than {f:g}x better)"
    return "unchanged", f"{b:.3g} -> {h:.3g}"
