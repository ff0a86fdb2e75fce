"""`GET /api/v1/jobs/{id}/report?base=JOB`: the Markdown test report."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse

from service.api.deps import MAX_ID, JobId, SessionDep, require_read
from service.domain.baselines import NotFound
from service.presentation.report import build_report

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["gate"])


@router.get(
    "/jobs/{job_id}/report",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/markdown": {"schema": {"type": "string"}}}}},
)
def report_endpoint(
    job_id: JobId,
    request: Request,
    session: SessionDep,
    base: Annotated[
        list[Annotated[int, Query(ge=1, le=MAX_ID)]] | None,
        Query(max_length=20, description="base job(s), one per suite"),
    ] = None,
) -> PlainTextResponse:
    """The Markdown test report of a job, compared with `base` when given."""
    try:
        text, _ = build_report(session, [job_id], base or [], str(request.base_url).rstrip("/"))
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")
