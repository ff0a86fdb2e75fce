"""REST API under /api/v1, plus /healthz and /readyz.

Reads are open unless `protect_reads` (then they need the bearer token, or for GET/HEAD the
web login cookie); writes need `Authorization: Bearer <token>` when a token is configured (401
without credentials, 403 with wrong ones). Every error answers JSON
`{"detail": ...}` naming the bad value and what was expected.
"""

from __future__ import annotations

import csv
import hmac
import io
import json
import math
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from sqlalchemy import text
from sqlalchemy.orm import Session

from service.api.schemas import (
    ArtifactOut,
    BaselineOut,
    BaselineSet,
    CaseOut,
    EventOut,
    Health,
    JobCreate,
    JobOut,
    JobStatus,
    MetricSummaryOut,
    Page,
    SampleOut,
    SuiteOut,
)
from service.persistence import db, queue, store
from service.persistence.artifacts import MAX_NAME, artifact_url
from service.persistence.models import BaselineRow, JobRow
from service.web_session import READ_METHODS, has_session
from workers.refs import HEX_SHA
from workers.registry import get_suite, suite_names
from workers.suite import UnknownSuiteInput

MAX_ID = 2**31 - 1  # ids are INTEGER columns: PostgreSQL's int4 ends here
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="job id")]
LABEL_PATTERN = r"^[^=]+=[\s\S]*$"
Cursor = Annotated[
    str | None, Query(pattern=r"^[0-9]{0,18}$", description="the `next` of the previous page")
]
Name = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


# ------------------------------------------------------------------------------------ plumbing


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


def _check_token(request: Request) -> None:
    expected = request.app.state.settings.token()
    if expected is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if not header or scheme.lower() != "bearer" or not given.strip():
        raise HTTPException(
            401,
            "missing credentials: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise HTTPException(403, "the bearer token is not valid for this service")


def require_write(request: Request) -> None:
    _check_token(request)


def require_read(request: Request) -> None:
    """With `protect_reads`: the bearer token, or for GET/HEAD the web pages' login cookie (the
    job page links its downloads here, and a browser cannot add a header to a link)."""
    settings = request.app.state.settings
    if not settings.protect_reads:
        return
    token = settings.token()
    if token is not None and request.method in READ_METHODS and has_session(request, token):
        return
    _check_token(request)


SessionDep = Annotated[Session, Depends(get_session)]
api = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)])
probes = APIRouter()


def _job_or_404(session: Session, job_id: int) -> JobRow:
    job = store.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    return job


def _cursor(value: str | None, name: str = "cursor") -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit() or len(value) > 18:
        raise HTTPException(422, f"{name} must be a value returned as 'next' by this endpoint, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------- jobs


@api.post(
    "/jobs",
    status_code=201,
    response_model=JobOut,
    dependencies=[Depends(require_write)],
    responses={200: {"description": "an earlier job with the same idempotency key"}},
)
def create_job(body: JobCreate, request: Request, response: Response) -> JobOut:
    """Queue a job. A repeated `idempotency_key` answers 200 with the job it first created."""
    state = request.app.state
    try:
        job, created = queue.submit_checked(state.engine, state.settings, body, state.executor)
    except queue.InvalidJob as exc:
        raise HTTPException(422, str(exc)) from exc
    except queue.JobConflict as exc:
        raise HTTPException(409, str(exc)) from exc
    except queue.SuiteUnavailable as exc:
        raise HTTPException(503, str(exc)) from exc
    if created:
        dispatcher = getattr(state, "dispatcher", None)
        if dispatcher is not None:
            dispatcher.wake()
    else:
        response.status_code = 200
    response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    return JobOut.of(job)


@api.get("/jobs", response_model=Page[JobOut])
def list_jobs(
    session: SessionDep,
    status: JobStatus | None = None,
    suite: Annotated[str | None, Query(max_length=100)] = None,
    commit: Annotated[str | None, Query(max_length=255, description="sha prefix or ref")] = None,
    device: Literal["cuda", "npu", "cpu"] | None = None,
    label: Annotated[str | None, Query(max_length=600, pattern=LABEL_PATTERN, description="K=V")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> Page[JobOut]:
    """Newest first; pass `next` back as `cursor` for the following page."""
    pair = None
    if label is not None:
        key, sep, val = label.partition("=")
        if not sep or not key:
            raise HTTPException(422, f"label must be KEY=VALUE, got {label!r}")
        pair = (key, val)
    jobs, nxt = store.list_jobs(
        session,
        status=status,
        suite=suite,
        commit=commit.lower() if commit and HEX_SHA.match(commit) else commit,
        device=device,
        label=pair,
        before_id=_cursor(cursor),
        limit=limit,
    )
    return Page[JobOut](items=[JobOut.of(j) for j in jobs], next=None if nxt is None else str(nxt))


@api.get("/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: JobId, session: SessionDep) -> JobOut:
    return JobOut.of(_job_or_404(session, job_id))


@api.post("/jobs/{job_id}/cancel", response_model=JobOut, dependencies=[Depends(require_write)])
def cancel_job(job_id: JobId, request: Request) -> JobOut:
    """Cancel a queued job now, or ask a running one to stop (it ends `cancelled`)."""
    try:
        job = queue.cancel(request.app.state.engine, job_id)
    except queue.JobNotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except queue.JobConflict as exc:
        raise HTTPException(409, str(exc)) from exc
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is not None:
        dispatcher.wake()
    return JobOut.of(job)


@api.get("/jobs/{job_id}/events", response_model=Page[EventOut])
def job_events(
    job_id: JobId,
    session: SessionDep,
    kind: Literal["status", "progress", "log", "info", "artifact"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    cursor: Cursor = None,
) -> Page[EventOut]:
    """Oldest first; poll with the last `next` (or the last id) as `cursor` for new events."""
    _job_or_404(session, job_id)
    events, nxt = store.job_events(session, job_id, after_id=_cursor(cursor) or 0, limit=limit, kind=kind)
    return Page[EventOut](
        items=[EventOut(id=e.id, at=e.at, kind=e.kind, message=e.message, data=e.data) for e in events],
        next=None if nxt is None else str(nxt),
    )


@api.get("/jobs/{job_id}/cases", response_model=Page[CaseOut])
def job_cases(job_id: JobId, session: SessionDep) -> Page[CaseOut]:
    """Every case with its result and per-metric summary (worst rank first, then statistics)."""
    _job_or_404(session, job_id)
    out = [
        CaseOut(
            case_id=c.case_id,
            name=c.name,
            fingerprint=c.fingerprint,
            params=c.params,
            status=c.status,
            error=c.error,
            expected_error=c.expected_error,
            metrics={
                k: MetricSummaryOut.model_validate(m, from_attributes=True) for k, m in c.metrics.items()
            },
        )
        for c in store.case_summaries(session, job_id)
    ]
    return Page[CaseOut](items=out, next=None)


def _fmt(v: float) -> str:
    return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))


@api.get(
    "/jobs/{job_id}/samples",
    response_model=Page[SampleOut],
    responses={200: {"content": {"text/csv": {}, "application/x-ndjson": {}}}},
)
def job_samples(
    job_id: JobId,
    request: Request,
    session: SessionDep,
    case: Annotated[str | None, Query(max_length=300)] = None,
    metric: Annotated[str | None, Query(max_length=200)] = None,
    rank: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
    attempt: Annotated[int | None, Query(ge=1, le=1000)] = None,
    format: Literal["json", "csv", "ndjson"] = "json",
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    cursor: Cursor = None,
) -> Any:
    """Raw samples. `json` is paginated; `csv` and `ndjson` stream every matching sample."""
    _job_or_404(session, job_id)
    if format == "json":
        rows, nxt = store.list_samples(
            session, job_id, case=case, metric=metric, rank=rank, attempt=attempt,
            after_id=_cursor(cursor) or 0, limit=limit,
        )  # fmt: skip
        return Page[SampleOut](
            items=[SampleOut.model_validate(r, from_attributes=True) for r in rows],
            next=None if nxt is None else str(nxt),
        )
    chunks = store.iter_samples(
        request.app.state.engine, job_id, case=case, metric=metric, rank=rank, attempt=attempt
    )
    fields = ("id", "attempt", "case", "fingerprint", "metric", "rank", "idx", "value")

    def csv_lines() -> Iterator[str]:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(fields)
        for chunk in chunks:
            for r in chunk:
                writer.writerow(
                    (r.id, r.attempt, r.case, r.fingerprint, r.metric, r.rank, r.idx, _fmt(r.value))
                )
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
        yield buf.getvalue()

    def ndjson_lines() -> Iterator[str]:
        for chunk in chunks:
            yield "".join(
                json.dumps({
                    "id": r.id, "attempt": r.attempt, "case": r.case, "fingerprint": r.fingerprint,
                    "metric": r.metric, "rank": r.rank, "idx": r.idx,
                    "value": r.value if math.isfinite(r.value) else None,
                }) + "\n"
                for r in chunk
            )  # fmt: skip

    name = f"job-{job_id}-samples.{format}"
    headers = {"Content-Disposition": f'attachment; filename="{name}"'}
    if format == "csv":
        return StreamingResponse(csv_lines(), media_type="text/csv; charset=utf-8", headers=headers)
    return StreamingResponse(ndjson_lines(), media_type="application/x-ndjson", headers=headers)


@api.get("/jobs/{job_id}/artifacts", response_model=Page[ArtifactOut])
def job_artifacts(job_id: JobId, session: SessionDep) -> Page[ArtifactOut]:
    _job_or_404(session, job_id)
    items = [
        ArtifactOut(
            name=a.name,
            media_type=a.media_type,
            size=a.size,
            created_at=a.created_at,
            url=artifact_url(job_id, a.name),
        )
        for a in store.list_artifacts(session, job_id)
    ]
    return Page[ArtifactOut](items=items, next=None)


@api.get("/jobs/{job_id}/artifacts/{name:path}", response_class=Response)
def job_artifact(
    job_id: JobId,
    name: Annotated[str, Path(min_length=1, max_length=MAX_NAME, description="full name, `/` kept")],
    session: SessionDep,
) -> Response:
    """One artifact's bytes by its full name as listed (`rank0/trace.json`)."""
    _job_or_404(session, job_id)
    art = store.get_artifact(session, job_id, name)
    if art is None:
        raise HTTPException(404, f"job {job_id} has no artifact {name!r}")
    if art.path:
        from pathlib import Path as FsPath

        if not FsPath(art.path).is_file():
            raise HTTPException(404, f"artifact {name!r} of job {job_id} is recorded but its file is gone")
        return FileResponse(art.path, media_type=art.media_type, filename=FsPath(art.path).name)
    return Response(art.blob or b"", media_type=art.media_type)


# -------------------------------------------------------------------------------------- suites


@api.get("/suites", response_model=Page[SuiteOut])
def list_suites() -> Page[SuiteOut]:
    """The suite catalogue: presets with their resolved params and cases, params schema, metrics."""
    items: list[SuiteOut] = []
    for n in suite_names():
        try:
            items.append(SuiteOut.model_validate(get_suite(n).describe()))
        except Exception as exc:  # one broken suite module must not hide the others
            items.append(SuiteOut(name=n, error=f"{type(exc).__name__}: {exc}"))
    return Page[SuiteOut](items=items, next=None)


@api.get("/suites/{name}", response_model=SuiteOut)
def get_suite_entry(name: Annotated[str, Path(max_length=100)]) -> SuiteOut:
    try:
        return SuiteOut.model_validate(get_suite(name).describe())
    except UnknownSuiteInput as exc:
        raise HTTPException(404, str(exc)) from exc
    except Exception as exc:
        raise HTTPException(503, f"suite {name!r} cannot be loaded: {type(exc).__name__}: {exc}") from exc


# ----------------------------------------------------------------------------------- baselines


def _baseline_out(b: BaselineRow) -> BaselineOut:
    return BaselineOut(
        name=b.name, commit=b.commit.sha if b.commit else None, job_id=b.job_id, note=b.note or "",
        updated_at=b.updated_at,
    )  # fmt: skip


@api.get("/baselines", response_model=Page[BaselineOut])
def list_baselines(session: SessionDep) -> Page[BaselineOut]:
    return Page[BaselineOut](items=[_baseline_out(b) for b in store.list_baselines(session)], next=None)


@api.get("/baselines/{name}", response_model=BaselineOut)
def get_baseline(name: Name, session: SessionDep) -> BaselineOut:
    b = store.get_baseline(session, name)
    if b is None:
        raise HTTPException(404, f"no baseline {name!r}")
    return _baseline_out(b)


@api.put("/baselines/{name}", response_model=BaselineOut, dependencies=[Depends(require_write)])
def set_baseline(name: Name, body: BaselineSet, request: Request) -> BaselineOut:
    """Point a named baseline at a commit or at one job (exactly one of the two)."""
    if (body.commit is None) == (body.job_id is None):
        raise HTTPException(422, "give exactly one of 'commit' (a sha or ref) or 'job_id'")
    with db.write_tx(request.app.state.engine) as s:
        if body.job_id is not None and s.get(JobRow, body.job_id) is None:
            raise HTTPException(422, f"job_id {body.job_id} does not exist")
        b = store.set_baseline(s, name, commit=body.commit, job_id=body.job_id, note=body.note)
        return _baseline_out(b)


# -------------------------------------------------------------------------------------- probes


@probes.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process answers (liveness)."""
    return Health(status="ok")


@probes.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request, response: Response) -> Health:
    """The store answers at the migrated head and the dispatcher (if enabled) is running."""
    state = request.app.state
    checks: dict[str, Any] = {}
    try:
        with state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        current, head = db.current_revision(state.engine), db.head_revision()
        checks["database"] = "ok" if current == head else f"schema at {current}, expected {head}"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    dispatcher = getattr(state, "dispatcher", None)
    if state.settings.dispatch:
        checks["dispatcher"] = "ok" if dispatcher is not None and dispatcher.alive() else "not running"
    checks["executor"] = getattr(state, "executor_error", None) or "ok"
    ready = all(v == "ok" for v in checks.values())
    response.status_code = 200 if ready else 503
    return Health(status="ready" if ready else "not ready", checks=checks)
