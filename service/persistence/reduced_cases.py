"""Reduced cases: an ended case's samples reduced over ranks, stored as one array per (job, run,
case) so a comparison reads a few hundred rows and one `np.frombuffer` per job instead of
reducing every sample in SQL and building a Python row per (case, metric, idx).

Layout of `ReducedCaseRow.data`: `RECORD` records (little-endian, unaligned) in (metric_id, idx)
order, one per metric and idx of the case: the metric id, the idx, the ranks that reported it
and the worst rank's value (NaN when any rank's is), exactly `samples.worst_rank_rows`' columns.
The rows are written and dropped where the case's summary rows are (`summaries`), so a reduced
case is one whose samples are final; anything else is read from the samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from service.persistence.models import JobRow, ReducedCaseRow
from service.persistence.samples import ReducedRows, higher_metric_ids, worst_rank_rows

RECORD = np.dtype([("metric_id", "<i8"), ("idx", "<i8"), ("ranks", "<i4"), ("value", "<f8")])


def store_reduced_cases(session: Session, job_id: int, attempt: int, case_ids: Sequence[int] | None) -> int:
    """Store the reduced rows of `case_ids` (None: every case with samples) of one run of a job,
    reduced from their samples now, replacing any stored before. Returns the rows written."""
    job = session.get(JobRow, job_id)
    if job is None:
        raise ValueError(f"no job {job_id} in the store; expected the job whose cases are stored reduced")
    rows = worst_rank_rows(session, job_id, attempt, higher_metric_ids(session, job.suite), job.world_size,
                           case_ids)
    p = ReducedCaseRow
    if case_ids is None:
        session.execute(delete(p).where(p.job_id == job_id, p.attempt == attempt))
    else:
        drop_reduced(session, job_id, attempt, case_ids)
    if not len(rows):
        return 0
    records = np.empty(len(rows), dtype=RECORD)
    records["metric_id"], records["idx"] = rows.metric_id, rows.idx
    records["ranks"], records["value"] = rows.ranks, rows.value
    cuts = np.flatnonzero(np.diff(rows.case_id)) + 1  # rows come in case order
    starts = np.r_[0, cuts].tolist()
    ends = np.r_[cuts, len(rows)].tolist()
    cases = rows.case_id[starts].tolist()
    session.execute(
        insert(p),
        [{"job_id": job_id, "attempt": attempt, "case_id": c, "rows": e - s, "data": records[s:e].tobytes()}
         for c, s, e in zip(cases, starts, ends, strict=True)],
    )
    return len(cases)


def drop_reduced(session: Session, job_id: int, attempt: int, case_ids: Iterable[int]) -> None:
    """Forget the reduced rows of cases whose samples may change again (reopened cases)."""
    ids = sorted(set(case_ids))
    if ids:
        p = ReducedCaseRow
        session.execute(delete(p).where(p.job_id == job_id, p.attempt == attempt, p.case_id.in_(ids)))


def drop_earlier_reduced(session: Session, job_id: int, attempt: int) -> None:
    """Reduced rows of the job's runs before `attempt`: never read again once a new run started."""
    p = ReducedCaseRow
    session.execute(delete(p).where(p.job_id == job_id, p.attempt < attempt))


def read_reduced(session: Session, job_id: int, attempt: int) -> ReducedRows:
    """Every reduced case of one run of a job, in (case_id, metric_id, idx) order."""
    p = ReducedCaseRow
    stored = session.execute(
        select(p.case_id, p.rows, p.data).where(p.job_id == job_id, p.attempt == attempt).order_by(p.case_id)
    ).all()
    if not stored:
        return ReducedRows.empty()
    counts = [r[1] for r in stored]
    bad = [(c, n, len(d)) for c, n, d in stored if len(d) != n * RECORD.itemsize]
    if bad:
        c, n, size = bad[0]
        raise ValueError(
            f"the reduced row of case {c} of job {job_id} run {attempt} holds {size} bytes; expected "
            f"{n} records of {RECORD.itemsize} bytes"
        )
    data = b"".join(r[2] for r in stored)
    records = np.frombuffer(data, dtype=RECORD)
    return ReducedRows(
        np.repeat(np.array([r[0] for r in stored], dtype=np.int64), counts),
        records["metric_id"].astype(np.int64),
        records["idx"].astype(np.int64),
        records["ranks"].astype(np.int64),
        records["value"].astype(np.float64),
    )
