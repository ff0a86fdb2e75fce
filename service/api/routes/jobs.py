"""`/api/v1/jobs`: queue, list, read and cancel jobs, and a job's events."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Response

from service.api.deps import (
    LABEL_PATTERN,
    Cursor,
    EngineDep,
    JobId,
    RunnerDep,
    SessionDep,
    SettingsDep,
    answer_queued,
    cursor_value,
    job_or_404,
    require_read,
    require_write,
)
from service.api.schemas import (
    EventOut,
    JobOut,
    JobStatus,
    Page,
)
from service.domain import submission
from service.domain.submission import JobCreate
from service.persistence import jobs as job_store
from service.persistence import queue
from workers.executors.base import ExecutorUnavailable
from workers.refs import HEX_SHA

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)])


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobOut,
    dependencies=[Depends(require_write)],
    responses={200: {"description": "an earlier job with the same idempotency key"}},
)
def create_job(
    body: JobCreate, response: Response, engine: EngineDep, settings: SettingsDep, runner: RunnerDep
) -> JobOut:
    """Queue a job. A repeated `idempotency_key` answers 200 with the job it first created."""
    try:
        job, created = submission.submit_checked(engine, settings, body, runner.executor)
    except submission.InvalidJob as exc:
        raise HTTPException(422, str(exc)) from exc
    except queue.JobConflict as exc:
        raise HTTPException(409, str(exc)) from exc
    except (submission.SuiteUnavailable, ExecutorUnavailable) as exc:
        raise HTTPException(503, str(exc)) from exc
    answer_queued(response, created, f"/api/v1/jobs/{job.id}", runner)
    return JobOut.of(job)


@router.get("/jobs", response_model=Page[JobOut])
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
    jobs, nxt = job_store.list_jobs(
        session,
        status=status,
        suite=suite,
        commit=commit.lower() if commit and HEX_SHA.match(commit) else commit,
        device=device,
        label=pair,
        before_id=cursor_value(cursor),
        limit=limit,
    )
    return Page[JobOut](items=[JobOut.of(j) for j in jobs], next=None if nxt is None else str(nxt))


@router.get("/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: JobId, session: SessionDep) -> JobOut:
    return JobOut.of(job_or_404(session, job_id))


@router.post("/jobs/{job_id}/cancel", response_model=JobOut, dependencies=[Depends(require_write)])
def cancel_job(job_id: JobId, engine: EngineDep, runner: RunnerDep) -> JobOut:
    """Cancel a queued job now, or ask a running one to stop (it ends `cancelled`)."""
    try:
        job = queue.cancel(engine, job_id)
    except queue.JobNotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except queue.JobConflict as exc:
        raise HTTPException(409, str(exc)) from exc
    runner.wake()
    return JobOut.of(job)


@router.get("/jobs/{job_id}/events", response_model=Page[EventOut])
def job_events(
    job_id: JobId,
    session: SessionDep,
    kind: Literal["status", "progress", "log", "info", "artifact"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    cursor: Cursor = None,
) -> Page[EventOut]:
    """Oldest first; poll with the last `next` (or the last id) as `cursor` for new events."""
    job_or_404(session, job_id)
    after = cursor_value(cursor) or 0
    events, nxt = job_store.job_events(session, job_id, after_id=after, limit=limit, kind=kind)
    return Page[EventOut](
        items=[EventOut(id=e.id, at=e.at, kind=e.kind, message=e.message, data=e.data) for e in events],
        next=None if nxt is None else str(nxt),
    )
