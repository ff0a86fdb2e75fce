"""What the engine gives: a verdict with its evidence per metric, per case and per pair of
jobs, the order of severity that makes a case's verdict, and strict JSON of any of them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal

import numpy as np

from service.domain.compare.config import CompareConfig
from service.domain.compare.sides import JobRef
from workers.stats import MetricStats
from workers.suite import MetricKind

Verdict = Literal[
    "regressed",
    "improved",
    "unchanged",
    "inconclusive",
    "failed",
    "worsened",
    "added",
    "removed",
    "errored",
    "skipped",
    "changed",
    "incomparable",
]
VERDICTS: tuple[str, ...] = Verdict.__args__  # type: ignore[attr-defined]

# Case verdict = the most severe of its metric verdicts, in this order.
SEVERITY: dict[str, int] = {
    v: i
    for i, v in enumerate(
        [
            "incomparable",
            "errored",
            "failed",
            "regressed",
            "worsened",
            "inconclusive",
            "changed",
            "improved",
            "unchanged",
            "added",
            "removed",
            "skipped",
        ]
    )
}
# Verdicts that make a gate fail (exit 1).
FAILING: frozenset[str] = frozenset({"failed", "regressed", "worsened"})


@dataclass(slots=True)
class MetricResult:
    """Verdict and evidence for one metric of one case. `ratio`/`ci_*` are head/base."""

    metric: str
    kind: MetricKind
    unit: str
    direction: str
    bound: float | None
    verdict: Verdict
    reason: str
    base: MetricStats | None = None
    head: MetricStats | None = None
    ratio: float | None = None  # time: ratio of medians; memory/accuracy/trajectory: of worst values
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None  # Mann-Whitney U, two-sided; None when not run
    delta: float | None = None  # head - base of the compared statistic, in `unit`
    rel_delta: float | None = None  # delta / |base|
    max_abs_diff: float | None = None  # trajectory: over the common steps
    max_rel_diff: float | None = None
    bound_ok: bool | None = None  # head's compared statistic against the bound (None: no bound)
    diagnostic: bool = False  # recorded, never judged (workers.suite.Metric.diagnostic)


@dataclass(slots=True)
class CaseResult:
    fingerprint: str
    name: str
    params: dict[str, Any]
    verdict: Verdict
    reason: str
    base_status: str | None
    head_status: str | None
    base_error: str | None = None
    head_error: str | None = None
    metrics: list[MetricResult] = field(default_factory=list)
    # the job that measured the side's case when its job took it from one (None: measured there)
    base_source_job: int | None = None
    head_source_job: int | None = None


@dataclass(slots=True)
class Comparison:
    """All case results of one base/head pair of jobs of one suite."""

    suite: str
    base: JobRef
    head: JobRef
    config: CompareConfig
    cases: list[CaseResult]
    # the jobs each side pooled (the gate's re-measurement rounds); empty: the side's one job
    base_jobs: tuple[int, ...] = ()
    head_jobs: tuple[int, ...] = ()

    @property
    def pooled(self) -> bool:
        return len(self.base_jobs) > 1 or len(self.head_jobs) > 1

    def counts(self) -> dict[str, int]:
        """Case verdict -> number of cases (every verdict present, zeros included)."""
        out = dict.fromkeys(VERDICTS, 0)
        for c in self.cases:
            out[c.verdict] += 1
        return out

    def metric_counts(self) -> dict[str, int]:
        out = dict.fromkeys(VERDICTS, 0)
        for c in self.cases:
            for m in c.metrics:
                out[m.verdict] += 1
        return out

    def failing_cases(self) -> list[CaseResult]:
        """Cases that fail a gate: a failing metric verdict, or an error on the head side."""
        return [c for c in self.cases if _case_fails(c)]

    @property
    def passed(self) -> bool:
        return not self.failing_cases()

    def time_regressions(self) -> list[tuple[CaseResult, MetricResult]]:
        return [
            (c, m) for c in self.cases for m in c.metrics if m.kind == "time" and m.verdict == "regressed"
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN/Inf become strings so the output is strict JSON)."""
        return {
            "suite": self.suite,
            "base": to_jsonable(self.base),
            "head": to_jsonable(self.head),
            "config": to_jsonable(self.config),
            "passed": self.passed,
            "counts": self.counts(),
            "metric_counts": self.metric_counts(),
            "cases": [to_jsonable(c) for c in self.cases],
            "base_jobs": list(self.base_jobs),
            "head_jobs": list(self.head_jobs),
        }


def _case_fails(c: CaseResult) -> bool:
    if c.verdict == "errored":
        return c.head_status == "error"
    if c.verdict == "added" and c.head_status == "error":
        return True
    return any(m.verdict in FAILING for m in c.metrics) or c.head_status == "failed"


def to_jsonable(obj: Any) -> Any:
    """Dataclasses/mappings/sequences -> plain JSON types; non-finite floats -> 'nan'/'inf'/'-inf'."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        if math.isfinite(f):
            return f
        return "nan" if f != f else ("inf" if f > 0 else "-inf")
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj
