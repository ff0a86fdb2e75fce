"""Case rows (one per fingerprint) and the result of each case in each attempt of a job."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.persistence.jobs import job_attempt
from service.persistence.models import (
    CaseResultRow,
    CaseRow,
    JobRow,
)
from workers.suite import Case


def ensure_cases(
    session: Session, cases: Iterable[Case], device: str, world_size: int
) -> dict[str, int]:
    """Case rows (one per fingerprint) for a job's matrix; returns case name -> case id."""
    out: dict[str, int] = {}
    for c in cases:
        fp = c.fingerprint(device, world_size)
        row = session.scalar(select(CaseRow).where(CaseRow.fingerprint == fp))
        if row is None:
            row = CaseRow(
                fingerprint=fp,
                suite=c.suite,
                name=c.name,
                params=dict(c.params),
                device=device,
                world_size=world_size,
                expected_error=c.expected_error,
            )
            session.add(row)
            session.flush()
        out[c.name] = row.id
    return out


def set_case_result(
    session: Session, job_id: int, case_id: int, status: str, error: str | None, attempt: int | None = None
) -> None:
    """Record (or overwrite, if reported again) a case's outcome in one run of a job: `attempt`,
    the run that reported it (default: the job's current one). A stale run passes its own
    attempt, so it never touches the rows of a later run, and readers never show its rows."""
    if attempt is None:
        job = session.get(JobRow, job_id)
        attempt = job_attempt(job) if job is not None else 1
    r = CaseResultRow
    row = session.scalar(select(r).where(r.job_id == job_id, r.attempt == attempt, r.case_id == case_id))
    if row is None:
        session.add(CaseResultRow(job_id=job_id, attempt=attempt, case_id=case_id, status=status,
                                  error=error))
    else:
        row.status, row.error = status, error


def result_case_names(session: Session, job_id: int, attempt: int) -> set[str]:
    """The names of the cases with a result stored for run `attempt` of the job."""
    r = CaseResultRow
    q = select(CaseRow.name).join(r, r.case_id == CaseRow.id).where(r.job_id == job_id, r.attempt == attempt)
    return set(session.scalars(q))


def drop_earlier_case_results(session: Session, job_id: int, attempt: int) -> None:
    """Case results of the job's runs before `attempt`: never shown again once a new run started."""
    r = CaseResultRow
    session.execute(delete(r).where(r.job_id == job_id, r.attempt < attempt))


def latest_case_results(session: Session, job_id: int) -> list[CaseResultRow]:
    """The case results of the job's latest attempt (what pages, the API, compare and gate read)."""
    job = session.get(JobRow, job_id)
    if job is None:
        return []
    r = CaseResultRow
    return list(session.scalars(select(r).where(r.job_id == job_id, r.attempt == job_attempt(job))))


def case_by_fingerprint(session: Session, fingerprint: str) -> CaseRow | None:
    return session.scalar(select(CaseRow).where(CaseRow.fingerprint == fingerprint))
