"""The API's dependencies, defined once: the store session and engine, the settings, the
executor and the dispatcher's wake-up, the token checks, the id and cursor parameters. Route
modules (the API's and the pages') take what the app holds through these, never from
`request.app.state` themselves.

Reads are open unless `protect_reads` (then they need the bearer token, or for GET/HEAD the
web login cookie); writes need `Authorization: Bearer <token>` when a token is configured (401
without credentials, 403 with wrong ones). Every error answers JSON
`{"detail": ...}` naming the bad value and what was expected.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Query, Request, Response
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from service.api.auth_limit import record_failure, refuse_if_locked
from service.api.input_rule import MAX_ID, BadInput, DbId, DbIdQuery, DbIntQuery, loads
from service.persistence import jobs
from service.persistence.models import JobRow
from service.settings import Settings
from service.web_session import READ_METHODS, has_session
from workers.executors.base import Executor

# the pages' share of the input rule and of the wrong-token lockout
__all__ = ["BadInput", "DbId", "DbIdQuery", "DbIntQuery", "loads", "record_failure", "refuse_if_locked"]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="job id")]
JobQuery = Annotated[int, Query(ge=1, le=MAX_ID, description="job id")]
LABEL_PATTERN = r"^[^=]+=[\s\S]*$"
Cursor = Annotated[
    str | None, Query(pattern=r"^[0-9]{0,18}$", description="the `next` of the previous page")
]
Name = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


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
    refuse_if_locked(request)
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        record_failure(request)
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


def get_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    return request.app.state.settings


def get_engine(request: Request) -> Engine:
    """The store's engine, for writes (`write_tx`) and streams that outlive one session."""
    return request.app.state.engine


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Runner:
    """What runs a queued job: the executor (None, with `error` saying why, when it could not be
    made) and `wake`, which tells the dispatcher a job was queued or cancelled (nothing without one)."""

    executor: Executor | None
    error: str | None
    wake: Callable[[], None]


def get_runner(request: Request) -> Runner:
    state = request.app.state
    dispatcher = getattr(state, "dispatcher", None)
    wake = dispatcher.wake if dispatcher is not None else _nothing
    return Runner(state.executor, getattr(state, "executor_error", None), wake)


def get_app_state(request: Request) -> Any:
    """The app's state as a whole: only the readiness probe, which caches its checks there."""
    return request.app.state


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[Engine, Depends(get_engine)]
RunnerDep = Annotated[Runner, Depends(get_runner)]
AppStateDep = Annotated[Any, Depends(get_app_state)]


def answer_queued(response: Response, created: bool, location: str, runner: Runner) -> None:
    """A submission's answer: 201 with the new job's or campaign's `Location`, the dispatcher woken
    to claim it; 200 with the earlier one's for a repeated idempotency key."""
    if created:
        runner.wake()
    else:
        response.status_code = 200
    response.headers["Location"] = location


def job_or_404(session: Session, job_id: int) -> JobRow:
    job = jobs.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    return job


def cursor_value(value: str | None, name: str = "cursor", maximum: int = MAX_ID) -> int | None:
    """The id a cursor names; ids past `maximum` (the id column's range) were never handed out."""
    if value is None or value == "":
        return None
    if not value.isdigit() or len(value) > 18 or int(value) > maximum:
        raise HTTPException(422, f"{name} must be a value returned as 'next' by this endpoint, got {value!r}")
    return int(value)


