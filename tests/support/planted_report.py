"""Planted jobs for the report's tests: cases with their per-repetition values (already reduced
over ranks), summarised by the store's own statistics (`workers.stats.summarise`), so the medians
the report prints are the ones a real job would store and every comparison is judged on the same
values a stored job would give (`ReportJob.series`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from service.persistence.summaries import CaseSummary
from service.presentation.report_model import JobData, ReportJob
from workers import verdict
from workers.stats import MetricStats, summarise

# Offsets of the planted repetitions around their median, in units of their spread: 11 of them,
# symmetric, so the median is exactly the value planted.
SPREAD = tuple(np.linspace(-1.0, 1.0, 11))


@dataclass(frozen=True)
class Planted:
    """One metric of one case: its statistics and the values they summarise."""

    stats: MetricStats
    values: tuple[float, ...]


def metric(
    name: str,
    values: list[float],
    unit: str = "ms",
    kind: str = "time",
    bound: float | None = None,
    direction: str = "lower",
) -> Planted:
    stats = summarise(
        values, direction, metric=name, unit=unit, kind=kind, bound=bound, samples=len(values), ranks=1
    )
    return Planted(replace(stats, passes=verdict.judge(kind, direction, bound, stats).ok), tuple(values))


@dataclass
class PlantedCase(CaseSummary):
    values: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def put(self, m: Planted) -> None:
        self.metrics[m.stats.metric] = m.stats
        self.values[m.stats.metric] = m.values


def case(
    name: str,
    params: dict[str, Any],
    *metrics: Planted,
    status: str = "passed",
    error: str | None = None,
    expected: str | None = None,
) -> PlantedCase:
    c = PlantedCase(
        0,
        name,
        f"fp{abs(hash(name + repr(sorted(params.items(), key=str)))) % 10**12:012d}",
        params,
        status,
        error,
        expected,
    )
    for m in metrics:
        c.put(m)
    return c


INFO = {
    "device_name": "NVIDIA H200",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "python": "3.12.3",
    "backends": [{"backend": "triton", "distribution": "gdnval", "version": "0.1.0", "commit": "ab" * 20}],
}


def job(
    job_id: int,
    suite: str,
    world_size: int,
    cases: list[PlantedCase],
    device: str = "cuda",
    artifacts: tuple[str, ...] = (),
) -> ReportJob:
    data = JobData(
        job_id,
        suite,
        "full",
        "succeeded",
        "ab" * 20,
        device,
        world_size,
        None,
        dict(INFO),
        cases,
        verdict="passed",
    )
    out = ReportJob(data, list(artifacts))
    out.series = Series(out)
    return out


class Series(dict):
    """A job's values by (fingerprint, metric), read from its planted cases when asked (a test may
    add a case or a metric after the job is made)."""

    def __init__(self, job: ReportJob) -> None:
        super().__init__()
        self.job = job

    def get(self, key: Any, default: Any = None) -> Any:
        for c in self.job.data.cases:
            if c.fingerprint == key[0] and key[1] in getattr(c, "values", {}):
                values = np.asarray(c.values[key[1]], dtype=float)
                return np.arange(values.size), values
        return default


def timed(fwd: float, fwd_bwd: float, spread: float = 1.0) -> list[Planted]:
    """fwd and fwd+bwd repetitions whose medians are exactly `fwd` and `fwd_bwd`."""
    return [
        metric("fwd_ms", [fwd + spread * x for x in SPREAD]),
        metric("fwd_bwd_ms", [fwd_bwd + spread * x for x in SPREAD]),
    ]


def memory(name: str, mib: float) -> Planted:
    return metric(name, [mib * 1024**2], "bytes", "memory")


def acc(prefix: str, value: float, bound: float | None = 1e-2) -> Planted:
    return metric(f"{prefix}_rel_l2", [value * 0.9, value], "ratio", "accuracy", bound)


def plant_job(
    engine: Any,
    suite: str,
    world_size: int,
    device: str,
    cases: dict[str, tuple[dict[str, Any], dict[str, list[Any]]]],
) -> int:
    """A finished job of a registered suite in the store, as the service writes one: case name ->
    (its parameters, metric -> one sequence of values per rank, idx = position); returns its id."""
    from sqlalchemy.orm import Session

    from service.persistence import cases as case_store
    from service.persistence import commits, summaries
    from service.persistence import samples as sample_store
    from service.persistence.models import JobRow
    from workers.registry import get_suite
    from workers.suite import Case

    with Session(engine) as s, s.begin():
        commit = commits.ensure_commit(s, "cd" * 20)
        row = JobRow(
            suite=suite,
            preset="full",
            params={},
            commit_id=commit.id,
            device=device,
            world_size=world_size,
            status="succeeded",
            attempts=1,
            info=dict(INFO),
        )
        s.add(row)
        s.flush()
        mids = sample_store.ensure_metrics(s, suite, get_suite(suite).metrics)
        planted = [Case(suite, name, params) for name, (params, _) in cases.items()]
        cids = case_store.ensure_cases(s, planted, device, world_size)
        for c in planted:
            case_store.set_case_result(s, row.id, cids[c.name], "passed", None)
        job_id = row.id
    rows = [
        (cids[name], mids[m], rank, i, float(v))
        for name, (_, metrics) in cases.items()
        for m, per_rank in metrics.items()
        for rank, values in enumerate(per_rank)
        for i, v in enumerate(values)
    ]
    sample_store.insert_samples(engine, job_id, rows)
    summaries.finish_summary(engine, job_id, 1)
    summaries.record_verdict(engine, job_id, ran=True)
    return job_id
