"""`/api/v1/campaigns`: queue a plan's jobs as one campaign, list and read campaigns, a
campaign's Markdown report, and two campaigns compared job by job."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from service.api.deps import (
    MAX_ID,
    Cursor,
    EngineDep,
    RunnerDep,
    SessionDep,
    SettingsDep,
    answer_queued,
    cursor_value,
    require_read,
    require_write,
)
from service.api.schemas import JobOut, Page
from service.domain import campaigns as domain
from service.domain import submission
from service.domain.baselines import NotFound
from service.domain.campaigns import CampaignCreate
from service.persistence import campaigns as store
from service.persistence import queue
from service.persistence.records import CampaignRecord, JobRecord
from service.presentation.campaign_report import campaign_report_markdown

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["campaigns"])
CampaignId = Annotated[int, Path(ge=1, le=MAX_ID, description="campaign id")]


class CampaignJobOut(BaseModel):
    key: str = Field(description="the plan entry, and @world size for an entry run at each world size")
    job: JobOut


class CampaignOut(BaseModel):
    id: int
    plan: str
    plan_version: int
    device: str
    world_sizes: list[int]
    commit: str | None
    backends: list[str]
    backend_source: str | None = Field(
        description="where the peer backends were installed from; null = already installed"
    )
    idempotency_key: str | None
    created_at: datetime
    status: str = Field(description="queued, running, succeeded, failed or cancelled: from its jobs")
    verdict: str | None = Field(description="passed only when every job passed; null while jobs are pending")
    jobs_by_status: dict[str, int]
    done: int
    total: int

    @classmethod
    def of(cls, row: CampaignRecord, jobs: list[JobRecord]) -> CampaignOut:
        st = domain.campaign_state(jobs)
        return cls(
            id=row.id, plan=row.plan_name, plan_version=row.plan_version, device=row.device,
            world_sizes=list(row.world_sizes), commit=row.commit_sha, backends=list(row.backends),
            backend_source=row.backend_source, idempotency_key=row.idempotency_key, created_at=row.created_at,
            status=st.status, verdict=st.verdict, jobs_by_status=st.jobs, done=st.done, total=st.total,
        )


class CampaignDetail(CampaignOut):
    plan_document: dict[str, Any] = Field(description="the plan as it was when the campaign was submitted")
    jobs: list[CampaignJobOut]


def _found(session: SessionDep, campaign_id: int) -> tuple[CampaignRecord, list[tuple[str, JobRecord]]]:
    found = domain.campaign_or_none(session, campaign_id)
    if found is None:
        raise HTTPException(404, f"no campaign {campaign_id}")
    return found


@router.post(
    "/campaigns",
    status_code=201,
    response_model=CampaignOut,
    dependencies=[Depends(require_write)],
    responses={200: {"description": "an earlier campaign with the same idempotency key"}},
)
def create_campaign(
    body: CampaignCreate, response: Response, session: SessionDep, engine: EngineDep, settings: SettingsDep,
    runner: RunnerDep,
) -> CampaignOut:
    """Queue every job of a plan as one campaign. An unknown plan, or a plan job the service
    could never run, is 422 naming the choices; a repeated `idempotency_key` answers 200."""
    try:
        row, created = domain.submit_campaign(engine, settings, body, runner.executor)
    except domain.InvalidCampaign as exc:
        raise HTTPException(422, str(exc)) from exc
    except queue.JobConflict as exc:
        raise HTTPException(409, str(exc)) from exc
    except submission.SuiteUnavailable as exc:
        raise HTTPException(503, str(exc)) from exc
    answer_queued(response, created, f"/api/v1/campaigns/{row.id}", runner)
    _, jobs = _found(session, row.id)
    return CampaignOut.of(row, [j for _, j in jobs])


@router.get("/campaigns", response_model=Page[CampaignOut])
def list_campaigns(
    session: SessionDep,
    plan: Annotated[str | None, Query(max_length=60)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Cursor = None,
) -> Page[CampaignOut]:
    """Newest first; pass `next` back as `cursor` for the following page."""
    rows, nxt = store.list_campaigns(session, plan=plan, before_id=cursor_value(cursor), limit=limit)
    jobs = store.jobs_of_campaigns(session, [r.id for r in rows])
    return Page[CampaignOut](
        items=[CampaignOut.of(r, jobs[r.id]) for r in rows], next=None if nxt is None else str(nxt)
    )


@router.get("/campaigns/{campaign_id}", response_model=CampaignDetail)
def get_campaign(campaign_id: CampaignId, session: SessionDep) -> CampaignDetail:
    """The campaign with each job's progress and verdict, in plan order."""
    row, jobs = _found(session, campaign_id)
    base = CampaignOut.of(row, [j for _, j in jobs])
    return CampaignDetail(
        **base.model_dump(), plan_document=row.plan,
        jobs=[CampaignJobOut(key=k, job=JobOut.of(j)) for k, j in jobs],
    )


@router.get(
    "/campaigns/{campaign_id}/report.md",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/markdown": {"schema": {"type": "string"}}}}},
)
def campaign_report(
    campaign_id: CampaignId,
    session: SessionDep,
    settings: SettingsDep,
    base: Annotated[int | None, Query(ge=1, le=MAX_ID, description="a campaign to compare with")] = None,
) -> PlainTextResponse:
    """The campaign's report as Markdown, compared with campaign `base` when given."""
    _, jobs = _found(session, campaign_id)
    base_ids = [j.id for _, j in _found(session, base)[1]] if base is not None else []
    url = settings.public_url or ""  # links only from the configured public URL
    try:
        text = campaign_report_markdown(session, [j.id for _, j in jobs], base_url=url, base_job_ids=base_ids)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")


@router.get("/campaigns/{campaign_id}/compare/{other_id}")
def compare_campaigns(
    campaign_id: CampaignId,
    other_id: Annotated[int, Path(ge=1, le=MAX_ID, description="the base campaign")],
    session: SessionDep,
) -> dict[str, Any]:
    """Campaign `campaign_id` (head) against `other_id` (base), job by job: jobs matched by plan
    key (suite entry and world size), each compared case by case as `/api/v1/compare` does."""
    try:
        return domain.compare_campaigns(session, other_id, campaign_id).to_dict()
    except (LookupError, NotFound) as exc:
        raise HTTPException(404, str(exc)) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
