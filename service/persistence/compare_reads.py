"""The rows the compare engine loads of one job: its metric definitions, the latest run's case
results and cases, its samples reduced over ranks in SQL, and the definitions it was judged
with. `service.domain.baselines.load_side` turns them into the engine's `JobSide`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import literal, select
from sqlalchemy.orm import Session

from service.persistence.models import CaseResultRow, CaseRow, JobRow, MetricRow, SampleRow, SummaryRow
from service.persistence.samples import worst_rank_per_idx


@dataclass
class StoredJob:
    job: JobRow
    attempt: int
    metric_rows: dict[int, MetricRow]  # the suite's, plus any other metric the samples name
    samples: np.ndarray  # (n, 5): case id, metric id, idx, ranks reporting, worst rank's value
    results: list[tuple[int, str, str | None]]  # (case id, status, error) of the latest run
    case_rows: dict[int, Any]  # every case with samples or a result: (id, fingerprint, name, params) rows
    judged: list[tuple[int, str, str, float | None]]  # (metric id, kind, direction, bound)


def read_job_for_compare(session: Session, job_id: int) -> StoredJob | None:
    """What `load_side` needs of job `job_id` (None: no such job)."""
    job = session.get(JobRow, job_id)
    if job is None:
        return None
    metric_rows = {m.id: m for m in session.scalars(select(MetricRow).where(MetricRow.suite == job.suite))}
    # a re-queued job keeps its interrupted run's samples (and a stale run may still write case
    # results under its attempt): read the latest run only, samples and statuses alike
    attempt = max(1, job.attempts or 0)
    higher = [m.id for m in metric_rows.values() if m.direction == "higher"]
    arr = _worst_rank_rows(session, job_id, attempt, higher, job.world_size)
    results = session.execute(
        select(CaseResultRow.case_id, CaseResultRow.status, CaseResultRow.error).where(
            CaseResultRow.job_id == job_id, CaseResultRow.attempt == attempt
        )
    ).all()
    all_case_ids = set(np.unique(arr[:, 0].astype(np.int64)).tolist()) | {r[0] for r in results}
    case_rows = {  # plain rows, not ORM objects: a job has hundreds of cases and nothing edits them
        c.id: c for c in session.execute(
            select(CaseRow.id, CaseRow.fingerprint, CaseRow.name, CaseRow.params)
            .where(CaseRow.id.in_(all_case_ids))
        )
    }  # fmt: skip
    missing = set(np.unique(arr[:, 1].astype(np.int64)).tolist()) - set(metric_rows)
    if missing:  # a metric of another suite name (renamed suite): still load its definition
        extra = session.scalars(select(MetricRow).where(MetricRow.id.in_(missing)))
        metric_rows.update({m.id: m for m in extra})
    judged = session.execute(
        select(SummaryRow.metric_id, SummaryRow.kind, SummaryRow.direction, SummaryRow.bound)
        .where(SummaryRow.job_id == job_id, SummaryRow.attempt == attempt, SummaryRow.kind.is_not(None))
        .distinct()
    ).all()
    return StoredJob(job, attempt, metric_rows, arr, [tuple(r) for r in results], case_rows,
                     [tuple(r) for r in judged])  # type: ignore[misc]  # fmt: skip


def _worst_rank_rows(
    session: Session, job_id: int, attempt: int, higher: list[int], world_size: int
) -> np.ndarray:
    """(n, 5) float64 rows of case id, metric id, ranks reporting, idx and the worst rank's value
    (NaN when any rank's is), one per (case, metric, idx): the rank reduction runs in SQL over
    the covering job index (`sample_store.worst_rank_per_idx`), and the rows come through the driver's
    own cursor into numpy in one call. A CP job's 100k raw rows become ~25k: loading, not
    comparing, was most of the gate's compare time."""
    s = SampleRow
    where = (s.job_id == job_id, s.attempt == attempt)
    if world_size == 1:  # one rank: the rows are the reduction already
        q: Any = select(s.case_id, s.metric_id, s.idx, literal(1), s.value).where(*where)
    else:
        q = worst_rank_per_idx(where, higher)
    conn = session.connection()
    compiled = q.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    positional = compiled.positiontup
    cursor = conn.connection.cursor()
    try:  # the DBAPI cursor, inside the session's transaction
        cursor.execute(str(compiled), [params[k] for k in positional] if positional else params)
        rows = cursor.fetchall()
    finally:
        cursor.close()
    if not rows:
        return np.empty((0, 5), dtype=np.float64)
    return np.array(rows, dtype=np.float64)  # case_id, metric_id, idx, n, w (None -> NaN)
