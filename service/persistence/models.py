"""The results store's ORM (SQLAlchemy 2 typed). The schema changes only through migrations/.

Samples are one row per (job, case, metric, rank, idx): raw per rank, never pre-aggregated, so
any statistic (rank-max, median, p90) is derived later and a series across commits is the
samples of one case fingerprint.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

JOB_STATUSES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
JOB_VERDICTS: tuple[str, ...] = ("passed", "failed", "errored")
FINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
CASE_STATUSES: tuple[str, ...] = ("passed", "failed", "error", "expected_error", "skipped")

# Deterministic constraint names: batch migrations on SQLite need them to alter tables.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime, dict[str, Any]: JSON}


class CommitRow(Base):
    """A code version jobs ran against: a sha or a ref as submitted, plus what we know about it."""

    __tablename__ = "commit"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha: Mapped[str] = mapped_column(String(255), unique=True)
    repo: Mapped[str | None] = mapped_column(String(500))
    branch: Mapped[str | None] = mapped_column(String(255))
    parent: Mapped[str | None] = mapped_column(String(255))
    message: Mapped[str | None] = mapped_column(Text)
    committed_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def waiting_for(status: str, claimed_by: str | None, progress_message: str) -> str | None:
    """What a claimed job waits for before its ranks start (it shows `queued`, held by its
    dispatcher: `service.persistence.queue.hold`); None for every other job."""
    if status == "queued" and claimed_by is not None:
        return progress_message or "resources"
    return None


class JobRow(Base):
    __tablename__ = "job"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    suite: Mapped[str] = mapped_column(String(100), index=True)
    preset: Mapped[str] = mapped_column(String(50))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    commit_id: Mapped[int | None] = mapped_column(ForeignKey("commit.id", ondelete="SET NULL"), index=True)
    # the commit of a backend from another repository (label `backend_source`): the code under test
    backend_commit: Mapped[str | None] = mapped_column(String(255), index=True)
    device: Mapped[str] = mapped_column(String(10))
    world_size: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20), default="queued")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    progress_done: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    progress_message: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str | None] = mapped_column(Text)
    info: Mapped[dict[str, Any]] = mapped_column(default=dict)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # whether the code passed (workers.verdict.job_verdict), apart from whether the job ran
    verdict: Mapped[str | None] = mapped_column(String(10))
    case_counts: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    cases: Mapped[list[str] | None] = mapped_column(JSON)  # None: every case of the preset
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    commit: Mapped[CommitRow | None] = relationship(lazy="joined")

    __table_args__ = (
        # the dispatcher's claim scan: queued jobs by priority, then age
        Index("ix_job_status_priority", "status", "priority", "id"),
        # the newest jobs of one status (recent-jobs lists, a series' succeeded jobs)
        Index("ix_job_status_id", "status", "id"),
    )

    @property
    def commit_sha(self) -> str | None:
        """The commit of our code the job ran (None: the service's installed code)."""
        return self.commit.sha if self.commit else None

    @property
    def waiting_for(self) -> str | None:
        return waiting_for(self.status, self.claimed_by, self.progress_message)

    @property
    def code_commit(self) -> str | None:
        """The commit of the code under test, the one every page, list and lookup shows: the
        backend's when the job runs one from another repository, else ours."""
        return self.backend_commit or self.commit_sha


class JobEventRow(Base):
    """Status changes, progress and log lines of a job, in order (id)."""

    __tablename__ = "job_event"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(20))  # status | progress | log | info | artifact
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    __table_args__ = (Index("ix_job_event_job_id_id", "job_id", "id"),)


class CaseRow(Base):
    """A case as a series identity: its fingerprint covers suite, params, device kind, world size."""

    __tablename__ = "case"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    suite: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(300))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    device: Mapped[str] = mapped_column(String(10))
    world_size: Mapped[int] = mapped_column(Integer)
    expected_error: Mapped[str | None] = mapped_column(String(200))

    __table_args__ = (Index("ix_case_suite_name", "suite", "name"),)


class CaseResultRow(Base):
    """The outcome of one case in one run (`attempt`) of a job (the executor's verdict, not a
    metric comparison). As with summaries, only the job's latest attempt is read: a new run drops
    earlier rows, and a stale run that still reports writes under its old attempt, never shown."""

    __tablename__ = "case_result"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    case_id: Mapped[int] = mapped_column(ForeignKey("case.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    status: Mapped[str] = mapped_column(String(20))
    error: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    # the job that measured the case when this one took its rows instead (NULL: measured here)
    source_job_id: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (UniqueConstraint("job_id", "attempt", "case_id"),)


class MetricRow(Base):
    """A suite's metric declaration, stored so summaries know each metric's direction and bound."""

    __tablename__ = "metric"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    suite: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(200))
    unit: Mapped[str] = mapped_column(String(50), default="")
    kind: Mapped[str] = mapped_column(String(20), default="check")
    direction: Mapped[str] = mapped_column(String(10), default="lower")
    bound: Mapped[float | None] = mapped_column(Float)
    description: Mapped[str] = mapped_column(Text, default="")
    # the metric's declared minimum effect; NULL: its kind's, resolved by workers.verdict.min_effect
    min_effect: Mapped[float | None] = mapped_column(Float)
    # recorded, never judged (workers.suite.Metric.diagnostic); NULL: workers.verdict.is_diagnostic's rule
    diagnostic: Mapped[bool | None] = mapped_column(Boolean)

    __table_args__ = (UniqueConstraint("suite", "name"),)


class SampleRow(Base):
    """One measured value. The job index covers the summary query (no table lookups).

    `attempt` is the job's run that produced it: a job re-queued after a crash keeps what its
    interrupted run reported, and summaries read only the latest attempt.
    """

    __tablename__ = "sample"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    case_id: Mapped[int] = mapped_column(ForeignKey("case.id", ondelete="CASCADE"))
    metric_id: Mapped[int] = mapped_column(ForeignKey("metric.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1)  # a re-queued job's earlier runs stay
    rank: Mapped[int] = mapped_column(Integer)
    idx: Mapped[int] = mapped_column(Integer)
    value: Mapped[float | None] = mapped_column(Float)  # NULL = NaN (SQLite stores NaN as NULL)

    __table_args__ = (
        Index("ix_sample_job", "job_id", "attempt", "case_id", "metric_id", "idx", "rank", "value"),
        Index("ix_sample_case", "case_id", "metric_id", "job_id"),
    )


class SummaryRow(Base):
    """Per-case, per-metric statistics (worst rank applied) of one run (`attempt`) of a job.

    Stored when a case ends (its samples never change after that) and, for any case left
    without rows, at the job's end; so pages, compare and a running job's page read these rows
    instead of re-aggregating up to millions of samples on every request. Rows of an earlier
    attempt are never read for a later one.
    """

    __tablename__ = "summary"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    case_id: Mapped[int] = mapped_column(ForeignKey("case.id", ondelete="CASCADE"))
    metric_id: Mapped[int] = mapped_column(ForeignKey("metric.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    count: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(Integer)
    ranks: Mapped[int] = mapped_column(Integer)
    median: Mapped[float | None] = mapped_column(Float)  # NULL = NaN
    p90: Mapped[float | None] = mapped_column(Float)
    min: Mapped[float | None] = mapped_column(Float)
    max: Mapped[float | None] = mapped_column(Float)
    mean: Mapped[float | None] = mapped_column(Float)
    # the definition it was judged with, copied from the metric when written
    kind: Mapped[str | None] = mapped_column(String(20))
    direction: Mapped[str | None] = mapped_column(String(10))
    bound: Mapped[float | None] = mapped_column(Float)
    diagnostic: Mapped[bool | None] = mapped_column(Boolean)  # NULL: written before it was copied
    nonfinite: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "case_id", "metric_id"),
        Index("ix_summary_series", "case_id", "metric_id", "job_id"),  # one series across jobs
        # the definitions one run was judged with (compare), read from the index alone
        Index("ix_summary_judged", "job_id", "attempt", "metric_id", "kind", "direction", "bound"),
    )


class ReducedCaseRow(Base):
    """One ended case's samples of one run of a job, reduced over ranks (one row per metric and
    idx) and stored as one array (`service.persistence.reduced_cases` says the layout).

    Written and dropped with the case's summary rows, so comparing two jobs reads a few hundred
    of these instead of reducing up to millions of samples; a case without one (a job stored
    before these existed, a case still running) is reduced from its samples instead.
    """

    __tablename__ = "reduced_case"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    case_id: Mapped[int] = mapped_column(ForeignKey("case.id", ondelete="CASCADE"))
    rows: Mapped[int] = mapped_column(Integer)  # records in `data`
    data: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (UniqueConstraint("job_id", "attempt", "case_id"),)


class ArtifactRow(Base):
    """A file a job produced; stored on disk under the artifacts directory (`path`) or inline."""

    __tablename__ = "artifact"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(300))
    media_type: Mapped[str] = mapped_column(String(200))
    size: Mapped[int] = mapped_column(Integer)
    path: Mapped[str | None] = mapped_column(String(1000))
    blob: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("job_id", "name"),)


class BaselineRow(Base):
    """A named reference point for comparisons: a commit, or one specific job."""

    __tablename__ = "baseline"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    commit_id: Mapped[int | None] = mapped_column(ForeignKey("commit.id", ondelete="SET NULL"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("job.id", ondelete="SET NULL"))
    note: Mapped[str] = mapped_column(Text, default="")
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    commit: Mapped[CommitRow | None] = relationship(lazy="joined")


class CampaignRow(Base):
    """The jobs one report needs, queued together from a plan (workers.plans); its status and
    verdict are derived from its jobs, never stored."""

    __tablename__ = "campaign"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    plan_name: Mapped[str] = mapped_column(String(60), index=True)
    plan_version: Mapped[int] = mapped_column(Integer)
    plan: Mapped[dict[str, Any]] = mapped_column()  # the plan document as submitted
    device: Mapped[str] = mapped_column(String(10))
    world_sizes: Mapped[list[int]] = mapped_column(JSON)
    commit_id: Mapped[int | None] = mapped_column(ForeignKey("commit.id", ondelete="SET NULL"))
    backends: Mapped[list[str]] = mapped_column(JSON)
    backend_source: Mapped[str | None] = mapped_column(String(500))  # where the peers came from
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    commit: Mapped[CommitRow | None] = relationship(lazy="joined")

    @property
    def commit_sha(self) -> str | None:
        return self.commit.sha if self.commit else None


class CampaignJobRow(Base):
    """A job of a campaign under its plan key (entry name, and @world size for per-size entries)."""

    __tablename__ = "campaign_job"
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaign.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(100))

    __table_args__ = (UniqueConstraint("campaign_id", "key"), Index("ix_campaign_job_job_id", "job_id"))


class GateRow(Base):
    """One gate run (`service.domain.gate`): its request, where its state machine stands, and
    its verdict with the reason per metric. Updated at every step; the jobs are `GateJobRow`s."""

    __tablename__ = "gate"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), unique=True)
    request: Mapped[dict[str, Any]] = mapped_column(default=dict)
    head: Mapped[str] = mapped_column(String(255), index=True)
    base: Mapped[str | None] = mapped_column(String(255))
    base_source: Mapped[str] = mapped_column(String(500), default="")
    backend: Mapped[str | None] = mapped_column(String(200))
    backend_repo: Mapped[str | None] = mapped_column(String(1000))
    device: Mapped[str] = mapped_column(String(10))
    world_size: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(10))  # waiting | done
    verdict: Mapped[str | None] = mapped_column(String(10))  # pass | fail | error
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text, default="")
    rounds: Mapped[int] = mapped_column(Integer, default=0)
    confirmations: Mapped[list[Any]] = mapped_column(JSON, default=list)  # confirmation pairs
    findings: Mapped[list[Any]] = mapped_column(JSON, default=list)  # each changed metric and why
    undecided: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class GateJobRow(Base):
    """A job a gate ran or reused, in its role (head, base, a round's or a confirmation's)."""

    __tablename__ = "gate_job"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gate_id: Mapped[int] = mapped_column(ForeignKey("gate.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(20))
    suite: Mapped[str] = mapped_column(String(100))
    reused: Mapped[bool] = mapped_column(Boolean, default=False)

    __table_args__ = (UniqueConstraint("gate_id", "job_id", "role"),)


class FindRow(Base):
    """One find run (`service.domain.find`): the first-parent range it bisects, where its state
    machine stands, its verdict with the first bad and last good commits and what moved, and the
    commits it measured. Updated at every step; the steps are `FindStepRow`s."""

    __tablename__ = "find"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), unique=True)
    request: Mapped[dict[str, Any]] = mapped_column(default=dict)
    head: Mapped[str] = mapped_column(String(255), index=True)  # the bad commit
    base: Mapped[str] = mapped_column(String(255))  # the good commit
    backend: Mapped[str | None] = mapped_column(String(200))
    backend_repo: Mapped[str | None] = mapped_column(String(1000))
    device: Mapped[str] = mapped_column(String(10))
    world_size: Mapped[int] = mapped_column(Integer)
    commits: Mapped[list[Any]] = mapped_column(JSON, default=list)  # after base up to head, oldest first
    phase: Mapped[str] = mapped_column(String(10))  # waiting | done
    verdict: Mapped[str | None] = mapped_column(String(10))  # pass | fail | error
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text, default="")
    first_bad: Mapped[str | None] = mapped_column(String(255))
    last_good: Mapped[str | None] = mapped_column(String(255))
    findings: Mapped[list[Any]] = mapped_column(JSON, default=list)  # what moved at the boundary
    measured: Mapped[list[Any]] = mapped_column(JSON, default=list)  # commits whose jobs it ran
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class FindStepRow(Base):
    """A step of a find: the gate of one commit and what it made of it (good, bad, skip)."""

    __tablename__ = "find_step"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    find_id: Mapped[int] = mapped_column(ForeignKey("find.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(10))  # verify | bisect | confirm
    commit: Mapped[str] = mapped_column(String(255))
    gate_id: Mapped[int] = mapped_column(ForeignKey("gate.id", ondelete="CASCADE"), index=True)
    outcome: Mapped[str | None] = mapped_column(String(10))  # good | bad | skip; None while it runs
    reason: Mapped[str] = mapped_column(Text, default="")

    __table_args__ = (UniqueConstraint("find_id", "position"),)
