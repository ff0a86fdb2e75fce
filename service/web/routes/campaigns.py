"""`/campaigns` and `/campaigns/{id}`: campaigns with their progress and verdict, and one
campaign's jobs (each linked to its page) with a link to its report."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import MAX_ID, DbIdQuery, get_session
from service.domain import campaigns as domain
from service.persistence import campaigns as store
from service.persistence import page_queries
from service.persistence.records import CampaignRecord, JobRecord
from service.presentation import views
from service.web.deps import error_page, page, require_page_read, utc_now, when

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])
VERDICT_CSS = {"passed": "v-unchanged", "failed": "v-failed", "errored": "v-errored"}


def _campaign_row(row: CampaignRecord, jobs: list[JobRecord]) -> dict[str, Any]:
    st = domain.campaign_state(jobs)
    return {
        "id": row.id, "plan": row.plan_name, "plan_version": row.plan_version, "device": row.device,
        "world_sizes": ", ".join(map(str, row.world_sizes)), "commit": row.commit_sha,
        # submitted without a commit: the service's installed code, at the commit its jobs recorded
        "ran_at": sorted({str(c)[:12] for j in jobs if (c := (j.info or {}).get("commit"))}),
        "created": when(row.created_at), "status": st.status, "verdict": st.verdict or "–",
        "verdict_class": VERDICT_CSS.get(st.verdict or "", ""), "progress_done": st.done,
        "progress_total": st.total,
    }


def _job_row(key: str, job: JobRecord, counts: dict[str, int], now: datetime) -> dict[str, Any]:
    word, css = views.job_verdict(job.status, job.verdict, counts)
    return {
        "key": key, "id": job.id, "status": job.status, "suite": job.suite, "preset": job.preset,
        "world_size": job.world_size, "progress_done": job.progress_done,
        "progress_total": job.progress_total, "verdict": word, "verdict_class": css,
        "duration": views.duration(job.started_at, job.finished_at, now if job.status == "running" else None),
    }


@router.get("/campaigns", response_class=HTMLResponse)
def campaigns_page(
    request: Request, before: DbIdQuery | None = None, session: Session = Depends(get_session)
) -> HTMLResponse:
    rows, nxt = store.list_campaigns(session, before_id=before, limit=50)
    jobs = store.jobs_of_campaigns(session, [r.id for r in rows])
    return page(request, "campaigns.html", nav="campaigns",
                campaigns=[_campaign_row(r, jobs[r.id]) for r in rows],
                next_url=f"/campaigns?before={nxt}" if nxt else None)


@router.get("/campaigns/{campaign_id}", response_class=HTMLResponse)
def campaign_page(
    campaign_id: int, request: Request, session: Session = Depends(get_session)
) -> HTMLResponse:
    found = domain.campaign_or_none(session, campaign_id) if 1 <= campaign_id <= MAX_ID else None
    if found is None:
        return error_page(request, 404, "No such campaign", f"There is no campaign {campaign_id}.")
    row, jobs = found
    counts = page_queries.job_case_counts(session, [j.id for _, j in jobs])
    now = utc_now()
    return page(request, "campaign.html", nav="campaigns",
                c=_campaign_row(row, [j for _, j in jobs]),
                jobs=[_job_row(k, j, counts.get(j.id, {}), now) for k, j in jobs],
                active=any(j.status in ("queued", "running") for _, j in jobs))
