"""A re-run of an interrupted job keeps the cases an earlier run finished.

A case is finished when its result is stored (every rank reported its end, so all its samples
are in). The new run takes those cases over instead of running them again: their result,
samples, summaries and reduced rows move to the new attempt (the rows readers show), and a job
event (data `kept`: case name -> attempt) says which attempt ran each kept case. The executor
is told to skip them.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.persistence.jobs import add_event
from service.persistence.models import (
    CaseResultRow,
    CaseRow,
    JobEventRow,
    ReducedCaseRow,
    SampleRow,
    SummaryRow,
)

KEPT = "kept"  # the key of a resume's event data: case name -> the attempt that ran it
_PER_CASE_ROWS = (CaseResultRow, SampleRow, SummaryRow, ReducedCaseRow)


def carry_finished_cases(session: Session, job_id: int, attempt: int) -> dict[str, int]:
    """Move the cases finished by runs before `attempt` to `attempt`; returns case name -> the
    attempt that produced it (empty for a first run or when no case had finished)."""
    r = CaseResultRow
    produced = dict(
        session.execute(
            select(r.case_id, func.max(r.attempt))
            .where(r.job_id == job_id, r.attempt < attempt)
            .group_by(r.case_id)
        ).all()
    )
    if not produced:
        return {}
    by_attempt: dict[int, list[int]] = {}
    for case_id, att in produced.items():
        by_attempt.setdefault(att, []).append(case_id)
    for att, case_ids in sorted(by_attempt.items()):
        for model in _PER_CASE_ROWS:
            session.execute(
                update(model)
                .where(model.job_id == job_id, model.attempt == att, model.case_id.in_(sorted(case_ids)))
                .values(attempt=attempt)
                .execution_options(synchronize_session=False)
            )
    named = select(CaseRow.id, CaseRow.name).where(CaseRow.id.in_(sorted(produced)))
    names = dict(session.execute(named).all())
    earlier = kept_before(session, job_id)  # a case kept once already names its real producer
    kept = {names[c]: earlier.get(names[c], att) for c, att in sorted(produced.items())}
    add_event(
        session, job_id, "log",
        f"attempt {attempt} keeps {len(kept)} case(s) finished by earlier attempts and skips them",
        {KEPT: kept},
    )
    return kept


def kept_before(session: Session, job_id: int) -> dict[str, int]:
    """What the job's latest earlier resume recorded: case name -> the attempt that ran it."""
    e = JobEventRow
    rows = session.scalars(select(e.data).where(e.job_id == job_id, e.kind == "log").order_by(e.id.desc()))
    for data in rows:
        if isinstance(data, dict) and isinstance(data.get(KEPT), dict):
            return {str(k): int(v) for k, v in data[KEPT].items()}
    return {}
