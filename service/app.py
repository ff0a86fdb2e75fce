"""The FastAPI application: store, dispatcher, API and (when present) the web pages.

`create_app(settings)` builds everything from one `Settings`; the lifespan upgrades the schema,
starts the dispatcher and, with `demo`, queues a quick job into an empty store.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import docs, problems
from service.api.input_rule import InputRule
from service.api.problems import MEDIA_TYPE, problem_body
from service.api.read_limit import ReadLimit
from service.api.routes import ROUTERS as API_ROUTERS
from service.dispatcher import Dispatcher
from service.domain import submission
from service.executor_choice import close_executors, get_executor
from service.persistence import db
from service.persistence.models import JobRow
from service.settings import Settings
from service.web.routes import router as web_router
from workers.provenance import installed_version
from workers.registry import suite_names

log = logging.getLogger("gdnval.service")
# `serve --demo` into an empty store: the capability checks, a gdn-op matrix (the eager core:
# the Triton interpreter takes minutes on CPU) and a cp-layer matrix over two CPU ranks, so the
# first pages show a verdict table, an accuracy matrix, P2P-vs-Ulysses tables and timing plots.
DEMO_JOBS: tuple[dict[str, Any], ...] = (
    {"suite": "capability", "preset": "quick", "device": "cpu"},
    {"suite": "gdn-op", "preset": "quick", "device": "cpu", "params": {"backends": ["eager"]}},
    {"suite": "cp-layer", "preset": "quick", "device": "cpu", "world_size": 2},
)


class BodyLimit:
    """Reject request bodies over `limit` bytes with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._reject(send, length.decode("latin-1"))
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # a chunked body: FastAPI turns this into a 413 answer
                    raise _TooLarge(self.limit)
            return message

        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(send, None)

    async def _reject(self, send: Send, size: str | None) -> None:
        """413 before the app answered; `size` None: a streamed body, its length unknown."""
        of = "" if size is None else f" of {size} bytes"
        body = problem_body(413, f"request body{of} exceeds the limit of {self.limit} bytes")
        await send({
            "type": "http.response.start", "status": 413,
            "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())],
        })
        await send({"type": "http.response.body", "body": body})


class _TooLarge(HTTPException):
    """Raised while reading a body past the limit; an HTTPException so FastAPI answers 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds the limit of {limit} bytes")


def _demo_jobs(app: FastAPI) -> None:
    """Queue the `DEMO_JOBS` when the store has none, so the pages have something to show; a
    job that cannot be queued (its suite not registered, too many ranks) is logged, the others
    still go."""
    state = app.state
    with Session(state.engine) as s:
        if s.scalar(select(func.count()).select_from(JobRow)):
            return
    names = set(suite_names())
    for spec in DEMO_JOBS:
        if spec["suite"] not in names:
            log.warning("--demo: suite %r is not registered; not queued", spec["suite"])
            continue
        body = {**spec, "labels": {"demo": "true"}}
        try:
            job, _ = submission.submit_checked(state.engine, state.settings, body, state.executor)
            log.warning("--demo: queued job %s (%s, quick, cpu)", job.id, spec["suite"])
        except Exception as exc:
            log.warning("--demo: could not queue a %s job: %s", spec["suite"], exc)


def create_app(settings: Settings | None = None, *, demo: bool = False) -> FastAPI:
    """The service application for `settings` (default: from the environment)."""
    settings = settings or Settings()
    engine = db.make_engine(settings.db_url, **db.request_pool(settings.db_url, settings.read_concurrency))
    # the dispatcher's own connections: its claims, heartbeats and the executors' sinks never wait
    # behind requests; a probe's own, so /readyz never waits behind them either
    job_engine = engine if db.is_memory(settings.db_url) else db.make_engine(settings.db_url)
    probe_engine = engine if db.is_memory(settings.db_url) else db.make_engine(
        settings.db_url, pool_size=1, max_overflow=0, pool_timeout=1
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db.upgrade(engine)
        try:
            app.state.executor = get_executor(settings)
        except Exception as exc:  # the API still serves results; /readyz says what is wrong
            log.error("executor %r unavailable: %s", settings.executor, exc)
            app.state.executor = None
            app.state.executor_error = f"{settings.executor}: {exc}"
        if settings.dispatch and app.state.executor is not None:
            app.state.dispatcher = Dispatcher(settings, job_engine, app.state.executor)
            app.state.dispatcher.start()
        if demo:
            _demo_jobs(app)
        try:
            yield
        finally:
            if app.state.dispatcher is not None:
                app.state.dispatcher.stop()
            close_executors()
            for eng in {engine, job_engine, probe_engine}:
                eng.dispose()

    app = FastAPI(
        title="gdnval",
        version=installed_version(),
        description="Validation service for fused Gated DeltaNet kernels and their CP layouts.",
        lifespan=lifespan,
        docs_url=None,  # served from packaged assets by service.api.docs, not from a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.probe_engine = probe_engine
    app.state.executor = None
    app.state.executor_error = None
    app.state.dispatcher = None

    problems.install(app)  # one error shape (RFC 9457) for every error, declared in the OpenAPI
    docs.install(app)
    for router in API_ROUTERS:
        app.include_router(router)
    app.include_router(web_router)
    app.add_middleware(InputRule, settings=settings)  # one input rule for every route, pages included
    app.add_middleware(ReadLimit, limit=settings.read_concurrency, wait_s=settings.read_wait_s)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)  # outermost: caps what InputRule reads
    return app


def app_from_env() -> Any:
    """Factory for `uvicorn --factory service.app:app_from_env`."""
    return create_app()
