"""`/` (to the job list) and `/static/{name}` (the vendored stylesheet and script)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, RedirectResponse

from service.web.deps import (
    STATIC,
)

router = APIRouter(include_in_schema=False)


@router.get("/", include_in_schema=False)
def index() -> RedirectResponse:
    return RedirectResponse("/jobs", status_code=307)


@router.get("/static/{name}", include_in_schema=False)
def static(name: str) -> FileResponse:
    """The vendored stylesheet and script (a route, not a mount: included routers drop mounts)."""
    path = (STATIC / name).resolve()
    if path.parent != STATIC or not path.is_file():
        raise HTTPException(404, f"no static file {name!r}")
    return FileResponse(path, headers={"Cache-Control": "public, max-age=300"})
