"""The rows the compare engine loads of one job: its metric definitions, the latest run's case
results and cases, its samples reduced over ranks (stored when its cases ended, else reduced in SQL now),
and the definitions it was judged with. `service.domain.baselines.load_side` turns them into
the engine's `JobSide`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.persistence.models import CaseResultRow, CaseRow, JobRow, MetricRow, SummaryRow
from service.persistence.records import JobRecord
from service.persistence.reduced_cases import read_reduced
from service.persistence.samples import ReducedRows, higher_metric_ids, worst_rank_rows
from service.persistence.summaries import sampled_case_ids
from workers import verdict
from workers.suite import Metric


@dataclass
class StoredJob:
    job: JobRecord
    attempt: int
    metrics: dict[int, Metric]  # by metric id: the suite's, plus any other metric the samples name
    samples: ReducedRows  # the latest run's samples reduced over ranks (`reduced_rows`)
    # (case id, status, error, the job that measured it when taken from one) of the latest run
    results: list[tuple[int, str, str | None, int | None]]
    case_rows: dict[int, Any]  # every case with samples or a result: (id, fingerprint, name, params) rows
    # (metric id, kind, direction, bound, diagnostic): the definitions the run was judged with
    judged: list[tuple[int, str, str, float | None, bool | None]]


def read_job_for_compare(session: Session, job_id: int) -> StoredJob | None:
    """What `load_side` needs of job `job_id` (None: no such job)."""
    job = session.get(JobRow, job_id)
    if job is None:
        return None
    metric_rows = {m.id: m for m in session.scalars(select(MetricRow).where(MetricRow.suite == job.suite))}
    # a re-queued job keeps its interrupted run's samples (and a stale run may still write case
    # results under its attempt): read the latest run only, samples and statuses alike
    attempt = max(1, job.attempts or 0)
    rows = reduced_rows(session, job, attempt)
    results = session.execute(
        select(CaseResultRow.case_id, CaseResultRow.status, CaseResultRow.error,
               CaseResultRow.source_job_id).where(
            CaseResultRow.job_id == job_id, CaseResultRow.attempt == attempt
        )
    ).all()
    all_case_ids = set(np.unique(rows.case_id).tolist()) | {r[0] for r in results}
    case_rows = {  # plain rows, not ORM objects: a job has hundreds of cases and nothing edits them
        c.id: c for c in session.execute(
            select(CaseRow.id, CaseRow.fingerprint, CaseRow.name, CaseRow.params)
            .where(CaseRow.id.in_(all_case_ids))
        )
    }
    missing = set(np.unique(rows.metric_id).tolist()) - set(metric_rows)
    if missing:  # a metric of another suite name (renamed suite): still load its definition
        extra = session.scalars(select(MetricRow).where(MetricRow.id.in_(missing)))
        metric_rows.update({m.id: m for m in extra})
    judged = session.execute(
        select(SummaryRow.metric_id, SummaryRow.kind, SummaryRow.direction, SummaryRow.bound,
               SummaryRow.diagnostic)
        .where(SummaryRow.job_id == job_id, SummaryRow.attempt == attempt, SummaryRow.kind.is_not(None))
        .distinct()
    ).all()
    metrics = {metric_id: metric_of(m) for metric_id, m in metric_rows.items()}
    return StoredJob(JobRecord.of(job), attempt, metrics, rows, [tuple(r) for r in results], case_rows,
                     [tuple(r) for r in judged])  # type: ignore[misc]


def metric_of(row: MetricRow) -> Metric:
    """A stored metric definition as the suites declare one."""
    return Metric(
        name=row.name,
        unit=row.unit or "",
        kind=row.kind,  # type: ignore[arg-type]
        direction=row.direction,  # type: ignore[arg-type]
        bound=row.bound,
        description=row.description or "",
        min_effect=row.min_effect,
        diagnostic=verdict.is_diagnostic(row.kind, row.bound, row.diagnostic),
    )


def reduced_rows(session: Session, job: JobRow, attempt: int) -> ReducedRows:
    """The run's samples reduced over ranks: the stored reductions of its ended cases (`reduced_cases`), and
    for the cases with samples but none (a job stored before those existed, a case still running or
    not yet summarised) the reduction in SQL. Either way the same arrays, in
    (case_id, metric_id, idx) order: a CP job's 100k raw samples are ~25k reduced rows, and
    reducing and reading them in SQL was most of the compare time."""
    stored = read_reduced(session, job.id, attempt)
    rest = None  # every case
    if len(stored):
        have = set(np.unique(stored.case_id).tolist())
        rest = [c for c in sampled_case_ids(session, job.id, attempt) if c not in have]
        if not rest:
            return stored
    higher = higher_metric_ids(session, job.suite)
    reduced = worst_rank_rows(session, job.id, attempt, higher, job.world_size, rest)
    return ReducedRows.concat([stored, reduced])
