"""`/healthz` (liveness) and `/readyz` (store at the migrated head, dispatcher running): outside
`/api/v1` and never behind a token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from service.api.schemas import (
    Health,
)
from service.persistence import db

router = APIRouter()


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process answers (liveness)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request, response: Response) -> Health:
    """The store answers at the migrated head and the dispatcher (if enabled) is running."""
    state = request.app.state
    checks: dict[str, Any] = {}
    try:
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
