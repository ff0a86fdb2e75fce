"""Named baselines: a name pointing at a commit or at one job."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.persistence.commits import ensure_commit
from service.persistence.models import BaselineRow
from service.persistence.records import BaselineRecord


def list_baselines(session: Session) -> list[BaselineRecord]:
    rows = session.scalars(select(BaselineRow).order_by(BaselineRow.name)).unique()
    return [BaselineRecord.of(b) for b in rows]


def _baseline_row(session: Session, name: str) -> BaselineRow | None:
    return session.scalars(select(BaselineRow).where(BaselineRow.name == name)).unique().first()


def get_baseline(session: Session, name: str) -> BaselineRecord | None:
    row = _baseline_row(session, name)
    return None if row is None else BaselineRecord.of(row)


def set_baseline(
    session: Session, name: str, *, commit: str | None = None, job_id: int | None = None, note: str = ""
) -> BaselineRecord:
    """Point baseline `name` at a commit or a job (exactly one); creates or moves it."""
    if (commit is None) == (job_id is None):
        raise ValueError("a baseline needs exactly one of commit or job_id")
    row = _baseline_row(session, name)
    if row is None:
        row = BaselineRow(name=name)
        session.add(row)
    crow = ensure_commit(session, commit) if commit else None
    row.commit_id = crow.id if crow else None
    row.commit = crow
    row.job_id = job_id
    row.note = note
    session.flush()
    return BaselineRecord.of(row)
