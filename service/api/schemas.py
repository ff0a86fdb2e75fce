"""Pydantic v2 models of the REST API (`/api/v1`): requests are strict (no coercion: `"2"` or
`true` for an integer is an error; unknown fields are errors), responses are plain.

Floats that are NaN or infinite are served as null (JSON has no NaN); the raw values are in
the CSV download.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.domain.submission import Device
from service.persistence.models import JobRow
from service.persistence.records import JobRecord
from workers.refs import REF_RULE, REF_SCHEMA, check_commit

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JobVerdict = Literal["passed", "failed", "errored"]
T = TypeVar("T")


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


class Progress(BaseModel):
    done: int
    total: int
    message: str


class JobOut(BaseModel):
    id: int
    status: JobStatus = Field(description="whether the job ran: succeeded, failed, cancelled, ...")
    verdict: JobVerdict | None = Field(
        description="whether the code passed (set when the job ends): passed, failed (a case "
        "failed) or errored (a case errored, or the job did not run to its end)"
    )
    case_counts: dict[str, int] | None = Field(description="cases by status, set with the verdict")
    cases: list[str] | None = Field(description="the cases it was restricted to; null = every case")
    suite: str
    preset: str
    params: dict[str, Any]
    commit: str | None = Field(description="the commit of our code the job runs; null = the installed code")
    code_commit: str | None = Field(
        None, description="the commit of the code under test: a backend's from another repository "
        "(label backend_source) when the job runs one, else `commit`; what pages show and lookups find",
    )
    device: Device
    world_size: int
    priority: int
    labels: dict[str, Any]
    idempotency_key: str | None
    progress: Progress
    waiting_for: str | None = Field(
        None, description="what a queued job already claimed by a dispatcher waits for before its ranks "
        "start (resources, nodes asked of the autoscaler); null for every other job",
    )
    error: str | None
    info: dict[str, Any]
    attempts: int
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, job: JobRow | JobRecord) -> JobOut:
        return cls(
            id=job.id, status=job.status, verdict=job.verdict, case_counts=job.case_counts,
            cases=job.cases, suite=job.suite, preset=job.preset, params=job.params or {},
            commit=job.commit_sha, code_commit=job.code_commit, device=job.device,
            world_size=job.world_size, priority=job.priority,
            labels=job.labels or {}, idempotency_key=job.idempotency_key,
            progress=Progress(done=job.progress_done, total=job.progress_total,
                              message=job.progress_message or ""),
            waiting_for=job.waiting_for, error=job.error, info=job.info or {}, attempts=job.attempts,
            cancel_requested=job.cancel_requested, created_at=job.created_at,
            started_at=job.started_at, finished_at=job.finished_at,
        )


class Page(BaseModel, Generic[T]):
    """Every list endpoint: the items and the cursor of the next page (null on the last)."""

    items: list[T]
    next: str | None


class EventOut(BaseModel):
    id: int
    at: datetime
    kind: str
    message: str
    data: dict[str, Any] | None


# built from `workers.stats.MetricStats` (the one record of a metric's statistics), field by field
class MetricSummaryOut(BaseModel):
    metric: str
    unit: str
    kind: str
    direction: str
    bound: float | None
    count: int = Field(description="values after the worst-rank reduction (one per idx)")
    samples: int = Field(description="raw samples over all ranks")
    ranks: int
    median: float | None
    p90: float | None
    min: float | None
    max: float | None
    mean: float | None
    passes: bool | None = Field(
        description="workers.verdict's judgement: time on its median, every other kind on its worst "
        "value; false for any non-finite value; null without a bound"
    )
    nonfinite: int = Field(0, description="non-finite values (each a failed sample)")

    @field_validator("median", "p90", "min", "max", "mean", "bound", mode="before")
    @classmethod
    def _nan_null(cls, v: float | None) -> float | None:
        return _finite(v)


class CaseOut(BaseModel):
    case_id: int
    name: str
    fingerprint: str
    params: dict[str, Any]
    status: str | None
    error: str | None
    expected_error: str | None
    metrics: dict[str, MetricSummaryOut]
    source_job_id: int | None = Field(
        None, description="the job that measured this case, when this job took it from that job (the same "
        "code: a backend gate's head job takes the reference backend's cases from its base job); null: "
        "measured by this job")


class SampleOut(BaseModel):
    id: int
    attempt: int
    case: str
    fingerprint: str
    metric: str
    rank: int
    idx: int
    value: float | None

    @field_validator("value", mode="before")
    @classmethod
    def _nan_null(cls, v: float | None) -> float | None:
        return _finite(v)


class ArtifactOut(BaseModel):
    name: str
    media_type: str
    size: int
    created_at: datetime
    url: str


class MetricOut(BaseModel):
    """A suite's declared metric (fields the suite adds beyond these pass through)."""

    model_config = ConfigDict(extra="allow")

    name: str
    unit: str
    kind: str
    direction: str
    bound: float | None = None
    description: str = ""


class SuiteCaseOut(BaseModel):
    name: str
    params: dict[str, Any]
    expected_error: str | None


class PresetOut(BaseModel):
    params: dict[str, Any] = Field(description="the preset's resolved parameters")
    cases: list[SuiteCaseOut]


class SuiteOut(BaseModel):
    """A catalogue entry. A suite whose module fails to load has only `name` and `error`."""

    name: str
    description: str = ""
    devices: list[Device] = Field(default_factory=list)
    min_world_size: int = 1
    presets: dict[str, PresetOut] = Field(default_factory=dict)
    params_schema: dict[str, Any] = Field(default_factory=dict, description="JSON schema of `params`")
    metrics: list[MetricOut] = Field(default_factory=list)
    error: str | None = Field(None, description="why the suite cannot be loaded")


class BaselineSet(BaseModel):
    """PUT /api/v1/baselines/{name}: exactly one of `commit` or `job_id`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    commit: str | None = Field(None, description=f"a commit: {REF_RULE}", json_schema_extra=REF_SCHEMA)
    job_id: int | None = Field(None, ge=1, le=2**31 - 1)  # an INTEGER id (int4 on PostgreSQL)
    note: str = Field("", max_length=2000)

    @field_validator("commit")
    @classmethod
    def _commit(cls, value: str | None) -> str | None:
        return None if value is None else check_commit(value)


class BaselineOut(BaseModel):
    name: str
    commit: str | None
    job_id: int | None
    note: str
    updated_at: datetime


class Health(BaseModel):
    status: str
    checks: dict[str, Any] = Field(default_factory=dict)
