"""What a job submission must satisfy before it is queued: the request body (`JobCreate`, the
`POST /api/v1/jobs` contract, also the web form's and the gate's) checked against the suite
catalogue and the executor; the queue (`service.persistence.queue`) then stores it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationInfo, field_validator
from sqlalchemy import Engine

from service.executor_choice import get_executor
from service.persistence.queue import JobRequest, submit
from service.persistence.records import JobRecord
from service.persistence.resume import TAKE_BACKENDS_LABEL, TAKE_FROM_LABEL
from workers.backend_source import BACKEND_SOURCE_LABEL, BackendSource, BackendSourceError
from workers.executors.base import PLACEMENT_LABEL, Executor, check_placement
from workers.refs import REF_RULE, REF_SCHEMA, check_commit
from workers.registry import get_suite
from workers.snapshot import SnapshotError
from workers.suite import Suite, UnknownSuiteInput, select_cases

if TYPE_CHECKING:
    from service.settings import Settings

Device = Literal["cuda", "npu", "cpu"]
LabelKey = Annotated[str, Field(min_length=1, max_length=100)]
LabelValue = Annotated[str, Field(max_length=500)]
# labels only the gate sets: they make a job copy another job's measurements as its own
GATE_LABELS = (TAKE_FROM_LABEL, TAKE_BACKENDS_LABEL)
GATE_CONTEXT = {"gate": True}  # the validation context of the gate's own submissions


class JobCreate(BaseModel):
    """POST /api/v1/jobs. Unknown fields are an error, so a typo never silently runs defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    suite: str = Field(min_length=1, max_length=100, examples=["capability"])
    preset: str = Field("quick", min_length=1, max_length=50)
    params: dict[str, JsonValue] = Field(default_factory=dict, description="overrides of the preset")
    commit: str | None = Field(
        None, description=f"code to test: {REF_RULE}; null = the installed code", json_schema_extra=REF_SCHEMA
    )
    device: Device = "cpu"
    world_size: int = Field(1, ge=1, le=4096)
    priority: int = Field(0, ge=-1000, le=1000, description="higher runs first")
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=50)
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)
    cases: list[Annotated[str, Field(min_length=1, max_length=300)]] | None = Field(
        None, min_length=1, max_length=1000,
        description="run only these cases of the preset (by name); null = every case",
    )

    @field_validator("commit")
    @classmethod
    def _commit(cls, value: str | None) -> str | None:
        return None if value is None else check_commit(value)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        reserved = sorted(set(value) & set(GATE_LABELS))
        if reserved and info.context != GATE_CONTEXT:
            raise ValueError(
                f"label(s) {', '.join(reserved)} are set by the gate only (they make a job take another "
                "job's measurements as its own); expected other label names"
            )
        return value


class InvalidJob(ValueError):
    """A submission the service can never run; the message names the bad value and the choices."""


class SuiteUnavailable(RuntimeError):
    """A registered suite whose module fails to load: the service's fault, not the request's."""


def validate_request(body: Any, executor: Executor | None, *, gate: bool = False) -> JobRequest:
    """Check a submission (a `JobCreate` or its dict) against the suite catalogue and the executor;
    `gate`: the gate's own submission, which may carry `GATE_LABELS`.

    Unknown suite/preset/parameter, a device the suite does not run on, and a world size no
    device pool can ever give all raise `InvalidJob` (the API answers 422 with the message).
    """
    context = GATE_CONTEXT if gate else None
    req = body if isinstance(body, JobCreate) else JobCreate.model_validate(body, context=context)
    try:
        suite = get_suite(req.suite)
        params = suite.resolve_params(req.preset, req.params, device=req.device)
    except UnknownSuiteInput as exc:
        raise InvalidJob(str(exc)) from exc
    except Exception as exc:
        raise SuiteUnavailable(f"suite {req.suite!r} cannot be loaded: {type(exc).__name__}: {exc}") from exc
    try:  # the case matrix of these parameters must expand (a bad candidate, packing, mode)
        cases = select_cases(suite.cases(params), list(req.cases or ()))
    except ValueError as exc:
        raise InvalidJob(f"suite {suite.name!r}: {exc}") from exc
    if req.device not in suite.devices:
        raise InvalidJob(f"suite {suite.name!r} runs on {list(suite.devices)}, not on device {req.device!r}")
    if req.world_size < suite.min_world_size:
        raise InvalidJob(
            f"suite {suite.name!r} needs world_size >= {suite.min_world_size}, got {req.world_size}"
        )
    nowhere = suite.nothing_runs(cases, req.world_size)
    if nowhere is not None:
        raise InvalidJob(f"suite {suite.name!r} preset {req.preset!r} on {req.device!r}: {nowhere}")
    placement = req.labels.get(PLACEMENT_LABEL) or None
    if placement is not None:
        try:
            check_placement(placement)
        except ValueError as exc:
            raise InvalidJob(f"label {PLACEMENT_LABEL!r}: {exc}") from exc
    source = req.labels.get(BACKEND_SOURCE_LABEL) or None
    if source is not None:
        try:
            BackendSource.parse(source)
        except BackendSourceError as exc:
            raise InvalidJob(f"label {BACKEND_SOURCE_LABEL!r}: {exc}") from exc
    snapshots = getattr(executor, "snapshots", None)  # the executor's repository, when it has one
    if req.commit is not None and snapshots is not None:
        try:
            snapshots.resolve(req.commit)
        except SnapshotError as exc:
            raise InvalidJob(
                f"commit {req.commit!r} is not a commit of the service's repository; expected a sha, "
                f"branch or tag it holds ({exc})"
            ) from exc
    if executor is not None:
        try:
            most = executor.most_ranks(req.device, placement)
        except ValueError as exc:
            raise InvalidJob(str(exc)) from exc
        if req.world_size > most:
            how = f" with placement {placement}" if placement else ""
            raise InvalidJob(
                f"world_size {req.world_size} on {req.device!r}{how} can never be satisfied: the "
                f"{executor.kind} executor offers at most {most} {req.device} rank(s)"
            )
    del params  # validated; the job stores the overrides as given, the preset fills the rest at run time
    return JobRequest(
        suite=suite.name,
        preset=req.preset,
        params=dict(req.params),
        commit=req.commit,
        device=req.device,
        world_size=req.world_size,
        priority=req.priority,
        labels=dict(req.labels),
        idempotency_key=req.idempotency_key,
        cases=tuple(req.cases) if req.cases else None,
    )


def runs_here(suite: Suite, preset: str, device: str, world_size: int) -> bool:
    """A suite's preset has a case that runs on `device` at `world_size` (the gate's default suites)."""
    if device not in suite.devices or world_size < suite.min_world_size or preset not in suite.presets:
        return False
    cases = suite.cases(suite.resolve_params(preset, device=device))
    return suite.nothing_runs(cases, world_size) is None


def submit_checked(
    engine: Engine, settings: Settings, body: Any, executor: Executor | None = None, *, gate: bool = False
) -> tuple[JobRecord, bool]:
    """Validate and queue; returns (job, created). The API, the web form and the gate share this
    path (`gate`: see `validate_request`)."""
    if executor is None:
        executor = get_executor(settings)
    return submit(engine, validate_request(body, executor, gate=gate))


def submit_job(engine: Engine, settings: Settings, body: Any, executor: Executor | None = None) -> JobRecord:
    """Validate and queue a submission (a dict of the `POST /api/v1/jobs` fields); returns the job."""
    return submit_checked(engine, settings, body, executor)[0]
