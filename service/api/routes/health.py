"""`/healthz` (liveness) and `/readyz` (readiness): outside `/api/v1`, never behind a token,
and never behind the requests' limit or their connections.

`/healthz` runs on the event loop and fails only in a state the process cannot leave by itself
(its dispatcher thread is gone), so a liveness probe restarts the service then, never for an
outage of the store or the cluster, which the process waits out. `/readyz` asks the store through
a connection of its own at most once per `STORE_CHECK_TTL_S` (a flood of probes costs one query a
second) and the executor's cluster (its alive nodes and resources per kind, as its Ray driver
last reported them) at most once per `EXECUTOR_CHECK_TTL_S`: a store or a cluster that cannot
take work makes the service not ready."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Response

from service.api.deps import AppStateDep
from service.api.schemas import (
    Health,
)
from service.persistence import db
from workers.executors.base import ExecutorUnavailable

router = APIRouter()
STORE_CHECK_TTL_S = 1.0
EXECUTOR_CHECK_TTL_S = 2.0
_store_check_lock = threading.Lock()
_executor_check_lock = threading.Lock()


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
async def healthz(state: AppStateDep, response: Response) -> Health:
    """The process answers and can go on by itself (liveness): 503 only when its dispatcher
    thread ended, which nothing but a restart brings back."""
    dispatcher = getattr(state, "dispatcher", None)
    if dispatcher is not None and not dispatcher.alive():
        response.status_code = 503
        return Health(status="dead", checks={"dispatcher": "its thread ended; restart the service"})
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(state: AppStateDep, response: Response) -> Health:
    """The store answers at the migrated head, the dispatcher (if enabled) is running and the
    executor's cluster answers (`cluster`: its alive nodes and resources per kind)."""
    checks: dict[str, Any] = {"database": _store_check(state)}
    dispatcher = getattr(state, "dispatcher", None)
    if state.settings.dispatch:
        checks["dispatcher"] = "ok" if dispatcher is not None and dispatcher.alive() else "not running"
    checks["executor"], cluster = _executor_check(state)
    ready = all(v == "ok" for v in checks.values())
    if cluster is not None:
        checks["cluster"] = cluster
    response.status_code = 200 if ready else 503
    return Health(status="ready" if ready else "not ready", checks=checks)


def _store_check(state: Any) -> str:
    """The store's answer, reused for `STORE_CHECK_TTL_S`."""
    with _store_check_lock:
        cached = getattr(state, "store_check", None)
        if cached is not None and time.monotonic() - cached[0] < STORE_CHECK_TTL_S:
            return str(cached[1])
        try:
            if getattr(state, "head_revision", None) is None:
                state.head_revision = db.head_revision()
            current, head = db.current_revision(state.probe_engine), state.head_revision
            result = "ok" if current == head else f"schema at {current}, expected {head}"
        except Exception as exc:
            result = f"unreachable: {type(exc).__name__}"
        state.store_check = (time.monotonic(), result)
        return result


def _executor_check(state: Any) -> tuple[str, Mapping[str, Any] | None]:
    """("ok" or why not, the executor's cluster), reused for `EXECUTOR_CHECK_TTL_S`."""
    error = getattr(state, "executor_error", None)
    executor = getattr(state, "executor", None)
    if error or executor is None:
        return error or "ok", None
    with _executor_check_lock:
        cached = getattr(state, "executor_check", None)
        if cached is not None and time.monotonic() - cached[0] < EXECUTOR_CHECK_TTL_S:
            return cached[1], cached[2]
        try:
            result, cluster = "ok", executor.cluster()
        except ExecutorUnavailable as exc:
            result, cluster = str(exc), None
        except Exception as exc:  # a probe must answer, whatever the executor raised
            result, cluster = f"unreachable: {type(exc).__name__}: {exc}", None
        state.executor_check = (time.monotonic(), result, cluster)
        return result, cluster
