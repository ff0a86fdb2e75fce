"""What every page shares: templates, the login check for pages, small formatting helpers. The
store session is `service.api.deps.get_session`, the one definition the API uses too."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from service.api.deps import get_settings
from service.presentation import views
from service.presentation.numbers import fmt
from service.web_session import has_session
from workers.registry import suite_names as registered_suites

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
DEVICES: tuple[str, ...] = ("cuda", "npu", "cpu")

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["fmt"] = fmt
templates.env.globals["pct"] = views.progress_percent


def require_page_read(request: Request) -> None:
    """With `protect_reads`, pages need the login cookie (browsers cannot send the API's bearer
    header on a link); without it the reader is sent to /login and back."""
    settings = get_settings(request)
    token = settings.token()
    if not settings.protect_reads or token is None:
        return
    if has_session(request, token):
        return
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    raise HTTPException(303, "log in first", headers={"Location": "/login?" + urlencode({"next": target})})


def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def error_page(request: Request, status_code: int, title: str, detail: str) -> HTMLResponse:
    return page(request, "error.html", status_code, nav="", code=status_code, title=title, detail=detail)


def when(value: datetime | None) -> str | None:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else None


def utc_now() -> datetime:
    return datetime.now(UTC)


def suite_names() -> list[str]:
    return registered_suites()


def api_samples_url(job_id: int, fmt: str) -> str:
    return f"/api/v1/jobs/{job_id}/samples?{urlencode({'format': fmt})}"
