"""The verdict rule, in one place: reduce over ranks -> statistics -> bound -> compare.

Every reader of samples calls this module: the executors' job monitor (a case's status), `gdnval
run` (its table and exit code), the store (stored summaries), the compare engine and the gate
(head against base), the report and the pages. It imports no torch and no database code.

1. **Reduce over ranks** and 2. **statistics**: `workers.stats`, the one implementation (per idx
   the worst rank; then count, median, p90, min, max, mean of the finite values, the count of
   non-finite ones and `worst`). A NaN or an infinity is a failed sample: it is counted, it
   fails the metric, it is never dropped silently.
3. **Bound.** A metric's bound is judged on one statistic per kind (`JUDGED_ON`):
   - time: the **median** (one slow repetition is noise, a slow median is the code);
   - memory, accuracy, check, trajectory: the **worst** value (one bad tensor, step or rank is a
     failure: these do not vary by chance).
   A metric with any non-finite sample fails whether or not it has a bound, unless it is a
   diagnostic (`Metric.diagnostic`: an element-wise max error, a raw trajectory), which is
   recorded and shown and never judged (`is_diagnostic`).
4. **Compare** (head against base; the vectorised engine is `service.domain.compare`, which takes its
   thresholds from here): time by the ratio of medians and a Mann-Whitney U test at `ALPHA`,
   regressed only when significant *and* larger than the metric's minimum effect; memory,
   accuracy and trajectory by their worst values against the minimum effect of their kind. The
   minimum effect is the metric's own `min_effect` or else `MIN_EFFECT[kind]`. A time's minimum
   effect is a ratio both ways: worse beyond `1 + effect`, better below `1 / (1 + effect)`.
   Wall-clock time on a shared CPU drifts by tens of percent from second to second (the machine's
   other tenants; docs/benchmarks.md, the CPU gate), so on `cpu` a time without a minimum effect of
   its own (raw wall clock) is recorded and shown, never judged: neither its bound nor its change
   (a move beyond `CPU_TIME_MIN_EFFECT`, a doubling, is shown as changed); a time that declares one
   (the reference-relative timings of `workers.measure.time_against_reference`) has measured its
   noise and is judged. On any device, a time of a job pair whose code under test is byte-identical
   (`workers.provenance.code_identity`) is shown, never judged: only the machine can have moved it
   (`time_not_judged`).

A relative-L2 error against an all-zero reference is the absolute L2 norm of the difference
(`relative_l2`): 0 when both are zero, the size of the error otherwise, never infinity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from workers.stats import MetricStats, summarise_samples

if TYPE_CHECKING:
    from workers.suite import Metric

Kind = Literal["accuracy", "time", "memory", "trajectory", "check"]
Direction = Literal["lower", "higher"]
Statistic = Literal["median", "worst"]
JobVerdict = Literal["passed", "failed", "errored"]
Change = Literal["worse", "better", "same", "unknown"]

JUDGED_ON: dict[str, Statistic] = {
    "time": "median",
    "memory": "worst",
    "accuracy": "worst",
    "check": "worst",
    "trajectory": "worst",
}
# The smallest relative change that counts as a change, per kind (a metric may declare its own).
# accuracy/trajectory: +100 % (twice the error); memory: 1 % (and 1 MiB, `MEMORY_MIN_BYTES`).
MIN_EFFECT: dict[str, float] = {
    "time": 0.05,
    "memory": 0.01,
    "accuracy": 1.0,
    "trajectory": 1.0,
    "check": 0.0,
}
CPU_TIME_MIN_EFFECT = 1.0  # undeclared wall-clock times on cpu: a doubling (or halving) is shown
# A reference-relative time (`workers.measure.time_against_reference`) moved by up to ~15 % between
# processes where the wall clock moved by 36-95 %, and by up to 40 % (wall clock 77 %) with the
# machine at load 8-10, where the gate's fresh confirmation pair keeps it from a false alarm
# (docs/benchmarks.md, the CPU gate).
REFERENCE_RELATIVE_MIN_EFFECT = 0.25
MEMORY_MIN_BYTES = 1024.0 * 1024.0
ALPHA = 0.01  # significance level of the time comparison (two-sided Mann-Whitney U)
ACCURACY_FLOOR = 1e-6  # an accuracy error below this never counts as worsened


# ----------------------------------------------------------------------------- bounds


def judged_value(kind: str, stats: MetricStats) -> float:
    """The statistic a bound of this kind is judged on (`JUDGED_ON`)."""
    return stats.median if JUDGED_ON.get(kind, "worst") == "median" else stats.worst


def bound_holds(value: float, bound: float | None, direction: str) -> bool:
    """`value` within `bound` in the metric's direction; a non-finite value never holds."""
    if not math.isfinite(value):
        return False
    if bound is None:
        return True
    return value <= bound if direction == "lower" else value >= bound


@dataclass(frozen=True)
class Judgement:
    """A metric's statistics against its bound: `ok` False fails the case; None: nothing to judge."""

    ok: bool | None
    value: float
    reason: str


def is_diagnostic(kind: str, bound: float | None, declared: bool | None) -> bool:
    """Whether a metric is a diagnostic (recorded, never judged): as declared
    (`workers.suite.Metric.diagnostic`); a definition stored before that was declared (None) by
    the rule the suites declare by: an accuracy or trajectory metric without a bound. A metric
    with a bound is always judged."""
    if bound is not None:
        return False
    if declared is not None:
        return bool(declared)
    return kind in ("accuracy", "trajectory")


def judge(kind: str, direction: str, bound: float | None, stats: MetricStats, name: str = "",
          *, diagnostic: bool = False) -> Judgement:
    """The bound rule: non-finite samples fail every judged metric; else the judged statistic vs
    the bound. A diagnostic is never judged (ok None), whatever its values."""
    label = f"{name} " if name else ""
    if stats.count == 0:
        return Judgement(None, math.nan, f"{label}has no samples")
    if diagnostic:
        bad = f", {stats.nonfinite} non-finite" if stats.nonfinite else ""
        return Judgement(None, stats.worst, f"{label}worst {stats.worst:.4g}{bad} (diagnostic, not judged)")
    if stats.nonfinite:
        bad = f"{stats.nonfinite} non-finite of {stats.count} value(s)"
        return Judgement(False, math.nan, f"{label}has {bad}")
    value = judged_value(kind, stats)
    if bound is None:
        return Judgement(None, value, f"{label}{JUDGED_ON.get(kind, 'worst')} {value:.4g} (no bound)")
    op = "<=" if direction == "lower" else ">="
    ok = bound_holds(value, bound, direction)
    stat = JUDGED_ON.get(kind, "worst")
    verb = "within" if ok else "breaks"
    return Judgement(ok, value, f"{label}{stat} {value:.4g} {verb} bound {op} {bound:.4g}")


def judge_metric(metric: Metric, stats: MetricStats) -> Judgement:
    return judge(metric.kind, metric.direction, metric.bound, stats, metric.name,
                 diagnostic=metric.diagnostic)


def judge_samples(metric: Metric, rows: Iterable[tuple[int, int, float]]) -> Judgement:
    """One metric of one case, from its raw (rank, idx, value) rows on every rank."""
    return judge_metric(metric, summarise_samples(rows, metric.direction))


# ----------------------------------------------------------------------------- comparison rules


def min_effect(kind: str, declared: float | None, device: str | None = None) -> float:
    """The smallest relative change that counts for this metric on this device: the declared
    one, else the kind's (on cpu an undeclared time's is `CPU_TIME_MIN_EFFECT`)."""
    if declared is not None:
        return float(declared)
    if kind == "time" and device == "cpu":
        return CPU_TIME_MIN_EFFECT
    return MIN_EFFECT.get(kind, 0.05)


def time_not_judged(declared: float | None, device: str | None, same_code: bool = False) -> str | None:
    """Why a time metric is shown but not judged (neither its bound nor its change), or None when
    it is: the code under test is byte-identical in base and head, or it is raw wall clock on a
    cpu (no minimum effect of its own; the reference-relative times are judged there instead)."""
    if same_code:
        return "code under test byte-identical in base and head: a time change is the machine's"
    if device == "cpu" and declared is None:
        return "raw wall clock on a cpu: judged only through the reference-relative times"
    return None


def time_moved(ratio: float, effect: float, direction: str) -> Change:
    """A time ratio head/base against the minimum effect, symmetric in the ratio: worse beyond
    `1 + effect`, better below `1 / (1 + effect)` (a +100 % effect is a doubling or a halving)."""
    if not math.isfinite(ratio) or ratio <= 0:
        return "unknown"
    slower = ratio > 1.0 + effect
    faster = ratio < 1.0 / (1.0 + effect)
    if not (slower or faster):
        return "same"
    return "worse" if slower == (direction == "lower") else "better"


def min_two_sided_p(n1: int, n2: int) -> float:
    """Smallest two-sided p-value the exact Mann-Whitney U test can give for these counts."""
    if n1 < 1 or n2 < 1:
        return 1.0
    return min(1.0, 2.0 / math.comb(n1 + n2, n1))


def repeats_for_significance(alpha: float = ALPHA) -> int:
    """The fewest repetitions per side (equal counts) that can reach significance at `alpha`."""
    n = 1
    while min_two_sided_p(n, n) >= alpha:
        n += 1
    return n



# ----------------------------------------------------------------------------- tensors


def relative_l2(diff_norm: float, ref_norm: float) -> float:
    """‖a−b‖/‖b‖; against an all-zero reference the absolute norm ‖a−b‖ (0 when both are zero)."""
    return diff_norm / ref_norm if ref_norm > 0 else diff_norm


# ----------------------------------------------------------------------------- case and job status

STATUS_SEVERITY: dict[str, int] = {"error": 0, "failed": 1, "expected_error": 2, "skipped": 3, "passed": 4}


def combine_rank_statuses(per_rank: Mapping[int, tuple[str, str | None]]) -> tuple[str, str | None]:
    """One status for a case from every rank's: the worst rank wins and names itself in the error.

    `expected_error` on some ranks and `passed` on others is a failure: the check is not uniform.
    """
    statuses = {s for s, _ in per_rank.values()}
    if statuses == {"expected_error", "passed"}:
        raised = sorted(r for r, (s, _) in per_rank.items() if s == "expected_error")
        return "failed", f"the expected error was raised on rank(s) {raised} only"
    worst = min(statuses, key=lambda s: STATUS_SEVERITY.get(s, 0))
    errors = [(r, e) for r, (s, e) in sorted(per_rank.items()) if s == worst and e]
    if not errors:
        return worst, None
    if len(per_rank) == 1:
        return worst, errors[0][1]
    rank, error = errors[0]
    return worst, f"rank {rank}: {error}"


def case_status(ran: tuple[str, str | None], judgements: Iterable[Judgement]) -> tuple[str, str | None]:
    """A case's status from how its run ended (ranks combined) and its metrics' judgements: a
    case that ran cleanly fails when any metric fails its bound or has a non-finite sample."""
    status, error = ran
    failing = [j.reason for j in judgements if j.ok is False]
    if status == "failed" and error and failing:  # the suite's own words first, then the bounds
        return status, f"{error}; {'; '.join(failing[:3])}"
    if status != "passed":
        return status, error
    if not failing:
        return "passed", None
    more = f" (+{len(failing) - 3} more)" if len(failing) > 3 else ""
    return "failed", "; ".join(failing[:3]) + more


PASSING_STATUSES: frozenset[str] = frozenset({"passed", "expected_error", "skipped"})


@dataclass(frozen=True)
class JobVerdictCounts:
    """A job's verdict and its case counts by status (the list, the page, the API, the report)."""

    verdict: JobVerdict
    counts: dict[str, int]

    def summary(self) -> str:
        parts = [f"{n} {s}" for s, n in self.counts.items() if n]
        return f"{self.verdict} ({', '.join(parts) or 'no cases'})"


def job_verdict(
    statuses: Iterable[str], *, ran: bool = True, expected: int | None = None
) -> JobVerdictCounts:
    """`errored` when the job did not run to its end, a case errored, or cases are missing;
    `failed` when a case failed; else `passed`. `expected`: the number of cases the job has."""
    counts = dict.fromkeys(STATUS_SEVERITY, 0)
    total = 0
    for status in statuses:
        counts[status if status in counts else "error"] += 1  # an unknown status is an error
        total += 1
    if expected is not None and total < expected:
        counts["not_run"] = expected - total
    if not ran or counts["error"] or counts.get("not_run"):
        verdict: JobVerdict = "errored"
    elif counts["failed"]:
        verdict = "failed"
    else:
        verdict = "passed"
    return JobVerdictCounts(verdict, counts)
