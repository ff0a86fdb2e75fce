"""`GET /api/v1/jobs/{id}/report?base=JOB` and `GET /api/v1/report?job=J1&job=J2&base=B`: the
Markdown test report of one job or of a set of jobs (one report, as `gdnval report` writes it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import PlainTextResponse

from service.api.deps import MAX_ID, JobId, SessionDep, SettingsDep, require_read
from service.domain.baselines import NotFound
from service.presentation.report import build_report

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["gate"])
MARKDOWN = {200: {"content": {"text/markdown": {"schema": {"type": "string"}}}}}


def _report(
    session: SessionDep, jobs: Sequence[int], bases: Sequence[int], public_url: str | None
) -> PlainTextResponse:
    """The report, linked only under the configured public URL (never the address asked)."""
    try:
        text, _ = build_report(session, jobs, bases, public_url or "")
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")


@router.get("/jobs/{job_id}/report", response_class=PlainTextResponse, responses=MARKDOWN)
def report_endpoint(
    job_id: JobId,
    session: SessionDep,
    settings: SettingsDep,
    base: Annotated[
        list[Annotated[int, Query(ge=1, le=MAX_ID)]] | None,
        Query(max_length=20, description="base job(s), one per suite"),
    ] = None,
) -> PlainTextResponse:
    """The Markdown test report of a job, compared with `base` when given."""
    return _report(session, [job_id], base or [], settings.public_url)


@router.get("/report", response_class=PlainTextResponse, responses=MARKDOWN)
def job_set_report(
    session: SessionDep,
    settings: SettingsDep,
    job: Annotated[
        list[Annotated[int, Query(ge=1, le=MAX_ID)]],
        Query(min_length=1, max_length=40, description="the jobs, in order"),
    ],
    base: Annotated[
        list[Annotated[int, Query(ge=1, le=MAX_ID)]] | None,
        Query(max_length=20, description="base job(s), one per suite"),
    ] = None,
) -> PlainTextResponse:
    """The Markdown test report of a set of jobs (a weak-scaling pair, a network at two layer
    counts), compared with `base` when given."""
    return _report(session, job, base or [], settings.public_url)
