"""Jobs put into a given state of the queue directly, for the queue tests that start from it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.persistence import queue
from service.persistence.models import JobRow, utcnow
from tests.support.api_support import FAKE


def fake_request(**kw: Any) -> queue.JobRequest:
    """A request for the fake suite (tests.support.api_support), `kw` its other fields."""
    return queue.JobRequest(suite=FAKE, **kw)


def job_row(engine: Any, job_id: int) -> JobRow:
    """The job's row as stored now (detached: read it, do not write through it)."""
    with Session(engine) as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        return job


def mark_running(engine: Any, job_id: int, owner: str, attempts: int, heartbeat_age_s: float = 0.0) -> None:
    """Store the job as running under `owner` (a dispatcher's host:pid:id), its heartbeat
    `heartbeat_age_s` old."""
    with Session(engine) as s, s.begin():
        job = s.get(JobRow, job_id)
        job.status, job.claimed_by, job.attempts = "running", owner, attempts
        job.heartbeat_at = utcnow() - timedelta(seconds=heartbeat_age_s)
