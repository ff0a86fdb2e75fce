"""Commit rows: the commit a job ran, and which commits a sha or a prefix names."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.persistence.models import CommitRow


def ensure_commit(session: Session, sha: str | None, **fields: Any) -> CommitRow | None:
    """The commit row for `sha` (a hex sha or a ref, as submitted), created on first use."""
    if not sha:
        return None
    row = session.scalar(select(CommitRow).where(CommitRow.sha == sha))
    if row is None:
        try:
            with session.begin_nested():
                row = CommitRow(sha=sha, **fields)
                session.add(row)
        except IntegrityError:  # created concurrently
            row = session.scalar(select(CommitRow).where(CommitRow.sha == sha))
    else:
        for key, value in fields.items():
            if value is not None:
                setattr(row, key, value)
    return row


FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def commit_ids(sha: str, *, min_prefix: int = 1) -> Select[Any]:
    """The ids of the commits `sha` names, as a subquery for `Job.commit_id.in_(...)`: a full hex
    sha is one unique-index lookup; anything shorter than `min_prefix` must match whole; else
    every commit whose sha starts with it. Commits are resolved first, so the jobs are then read
    by `job.commit_id`, never by walking every job of a suite."""
    q = select(CommitRow.id)
    if FULL_SHA.fullmatch(sha) or len(sha) < min_prefix:
        return q.where(CommitRow.sha == sha)
    return q.where(CommitRow.sha.startswith(sha, autoescape=True))


def recorded_parent(session: Session, prefix: str) -> str | None:
    """The parent recorded for the first commit whose sha starts with `prefix` (the gate's base
    when no repository knows the head), or None."""
    row = session.scalars(select(CommitRow).where(CommitRow.sha.startswith(prefix, autoescape=True))).first()
    return row.parent if row is not None else None
