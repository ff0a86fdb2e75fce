"""`/jobs`: the job list with its filters, its live rows (`/jobs/rows`) and the submit form."""

from __future__ import annotations

import hmac
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from service.api import deps
from service.api.deps import (
    EngineDep,
    RunnerDep,
    SettingsDep,
    get_session,
    record_failure,
    refuse_if_locked,
)
from service.domain import submission
from service.persistence import gates as gate_store
from service.persistence import jobs as job_store
from service.persistence import page_queries, queue
from service.persistence.models import JOB_STATUSES, JobRow
from service.presentation import views
from service.web.deps import (
    DEVICES,
    page,
    require_page_read,
    suite_names,
    utc_now,
    when,
)
from workers.executors.base import ExecutorUnavailable
from workers.suite import PRESETS

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])


def _job_row(job: JobRow, counts: dict[str, int], now: datetime) -> dict[str, Any]:
    word, css = views.job_verdict(job.status, job.verdict, counts)
    return {
        "id": job.id,
        "status": job.status,
        "progress_done": job.progress_done,
        "progress_total": job.progress_total,
        "suite": job.suite,
        "preset": job.preset,
        "commit": job.code_commit,
        "device": job.device,
        "world_size": job.world_size,
        "created": when(job.created_at),
        "duration": views.duration(job.started_at, job.finished_at, now if job.status == "running" else None),
        "verdict": word,
        "verdict_class": css,
    }


def _jobs_context(session: Session, status: str | None, suite: str | None, commit: str | None,
                  before: int | None) -> dict[str, Any]:
    status = status if status in JOB_STATUSES else None
    jobs, nxt = job_store.list_jobs(session, status=status or None, suite=suite or None,
                                    commit=commit or None, before_id=before, limit=50)
    counts = page_queries.job_case_counts(session, [j.id for j in jobs])
    gates = gate_store.gates_of_jobs(session, [j.id for j in jobs])
    now = utc_now()
    rows = [{**_job_row(j, counts.get(j.id, {}), now), "gates": gates.get(j.id, [])} for j in jobs]
    filt = {k: v for k, v in (("status", status), ("suite", suite), ("commit", commit)) if v}
    return {
        "jobs": rows,
        "active": sum(1 for r in rows if r["status"] in ("queued", "running")),
        "filtered": bool(filt),
        "f": {"status": status, "suite": suite, "commit": commit},
        "rows_url": "/jobs/rows" + ("?" + urlencode({**filt, **({"before": before} if before else {})})
                                    if filt or before else ""),
        "next_url": "/jobs?" + urlencode({**filt, "before": nxt}) if nxt else None,
    }


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, status: str | None = None, suite: str | None = None,
              commit: str | None = None, before: deps.DbIdQuery | None = None,
              session: Session = Depends(get_session)) -> HTMLResponse:
    ctx = _jobs_context(session, status, suite, commit, before)
    known = sorted(set(suite_names()) | set(page_queries.suites_with_results(session)))
    return page(request, "jobs.html", nav="jobs", statuses=JOB_STATUSES, suites=known,
                 presets=PRESETS, devices=DEVICES, form={"device": "cpu", "preset": "quick"}, form_open=False,
                 message=None, **ctx)


@router.get("/jobs/rows", response_class=HTMLResponse)
def jobs_rows(request: Request, status: str | None = None, suite: str | None = None,
              commit: str | None = None, before: deps.DbIdQuery | None = None,
              session: Session = Depends(get_session)) -> HTMLResponse:
    """The job list's rows alone: the page's script swaps them in while jobs are live."""
    ctx = _jobs_context(session, status, suite, commit, before)
    resp = page(request, "_job_rows.html", **ctx)
    resp.headers["X-Active-Jobs"] = str(ctx["active"])
    resp.headers["Cache-Control"] = "no-store"
    return resp


@router.post("/jobs/new", response_class=HTMLResponse)
def submit_job(
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    runner: RunnerDep,
    suite: str = Form(...),
    preset: str = Form("quick"),
    commit: str = Form(""),
    device: str = Form("cpu"),
    world_size: int = Form(1),
    priority: int = Form(0),
    params: str = Form("{}"),
    labels: str = Form("{}"),
    token: str = Form(""),
    session: Session = Depends(get_session),
) -> Response:
    """The form twin of POST /api/v1/jobs: same token, same validation, then the job's page."""
    form = {"suite": suite, "preset": preset, "commit": commit, "device": device, "world_size": world_size,
            "priority": priority, "params": params, "labels": labels}

    def again(status_code: int, message: str) -> HTMLResponse:
        ctx = _jobs_context(session, None, None, None, None)
        known = sorted(set(suite_names()) | set(page_queries.suites_with_results(session)))
        return page(request, "jobs.html", status_code, nav="jobs", statuses=JOB_STATUSES, suites=known,
                     presets=PRESETS, devices=DEVICES, form=form, form_open=True, message=message,
                     message_class="bad", **ctx)

    expected = settings.token()
    if expected is not None:
        refuse_if_locked(request)
    if expected is not None and not hmac.compare_digest(token.encode(), expected.encode()):
        record_failure(request)
        return again(401, "Wrong or missing API token: the job was not submitted.")
    try:
        body = {
            "suite": suite, "preset": preset, "commit": commit.strip() or None, "device": device,
            "world_size": world_size, "priority": priority,
            "params": deps.loads(params or "{}", "params"),
            "labels": deps.loads(labels or "{}", "labels"),
        }
    except deps.BadInput as exc:
        return again(422, f"Parameters and labels must be JSON objects: {exc}")
    from pydantic import ValidationError

    try:  # the API's own submit path: same validation, same queue
        job, _ = submission.submit_checked(engine, settings, body, runner.executor)
    except ValidationError as exc:
        return again(422, "Not submitted: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()))
    except (submission.InvalidJob, queue.JobConflict, ValueError) as exc:
        return again(422, f"Not submitted: {exc}")
    except (submission.SuiteUnavailable, ExecutorUnavailable) as exc:
        return again(503, f"Not submitted: {exc}")
    runner.wake()
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)
