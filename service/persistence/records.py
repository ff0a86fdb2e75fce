"""Plain records of stored objects: what the domain and the pages take from the store.

The ORM rows (`service.persistence.models`) stay inside persistence: every read the domain
uses answers one of these frozen dataclasses, converted here from its row inside the session,
so a rule never holds a live row (no lazy load after the session closed, no accidental write)
and a test builds one without a database. The field names are the rows', so a page or a schema
reads a record and a row alike.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Self

from service.persistence.models import BaselineRow, CampaignRow, JobRow, waiting_for


def _columns(cls: type, row: Any) -> dict[str, Any]:
    return {f.name: getattr(row, f.name) for f in fields(cls)}


@dataclass(frozen=True)
class JobRecord:
    """One job as stored: its request, where it stands and what it found."""

    id: int
    suite: str
    preset: str
    params: dict[str, Any]
    commit_sha: str | None  # our code's commit (None: the service's installed code)
    backend_commit: str | None  # a backend's from another repository, when the job runs one
    device: str
    world_size: int
    status: str
    priority: int
    labels: dict[str, Any]
    idempotency_key: str | None
    progress_done: int
    progress_total: int
    progress_message: str
    error: str | None
    info: dict[str, Any]
    attempts: int
    verdict: str | None
    case_counts: dict[str, Any] | None
    cases: list[str] | None
    cancel_requested: bool
    claimed_by: str | None  # the dispatcher holding it (a queued job it holds waits for resources)
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @property
    def code_commit(self) -> str | None:
        """The commit of the code under test (`JobRow.code_commit`): the backend's, else ours."""
        return self.backend_commit or self.commit_sha

    @property
    def waiting_for(self) -> str | None:
        return waiting_for(self.status, self.claimed_by, self.progress_message)

    @classmethod
    def of(cls, row: JobRow) -> Self:
        return cls(**_columns(cls, row))


@dataclass(frozen=True)
class CampaignRecord:
    """One campaign as stored: its plan and setting (its state is its jobs')."""

    id: int
    plan_name: str
    plan_version: int
    plan: dict[str, Any]
    device: str
    world_sizes: list[int]
    commit_sha: str | None
    backends: list[str]
    backend_source: str | None
    idempotency_key: str | None
    created_at: datetime

    @classmethod
    def of(cls, row: CampaignRow) -> Self:
        return cls(**_columns(cls, row))


@dataclass(frozen=True)
class BaselineRecord:
    """A named baseline: the commit (its sha) or the one job it points at."""

    name: str
    commit: str | None
    job_id: int | None
    note: str
    updated_at: datetime

    @classmethod
    def of(cls, row: BaselineRow) -> Self:
        commit = row.commit.sha if row.commit else None
        return cls(row.name, commit, row.job_id, row.note or "", row.updated_at)
