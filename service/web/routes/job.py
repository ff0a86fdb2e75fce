"""`/jobs/{id}`: one job's header, tables, plots and downloads; its Markdown report, and the
report of a comparison (`/compare/report.md`)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy.orm import Session

from service.api.deps import DbId, DbIdQuery, SettingsDep, get_session
from service.domain.baselines import job_repetitions
from service.persistence import artifacts as artifact_store
from service.persistence import finds as find_store
from service.persistence import gates as gate_store
from service.persistence import jobs as job_store
from service.persistence import page_queries, queue
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store
from service.persistence.artifacts import artifact_url
from service.persistence.models import FINAL_STATUSES, JobRow
from service.presentation import views
from service.presentation.conventions import memory_tracked
from service.presentation.report import build_report
from service.settings import Settings
from service.web import charts
from service.web.deps import (
    api_samples_url,
    error_page,
    page,
    require_page_read,
    utc_now,
    when,
)
from workers.deadline import job_deadline_s
from workers.registry import get_suite

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])


# What a reader compares between two runs first; the rest of the run info is one click away.
INFO_KEYS = ("device_name", "device_count", "placement", "distinct_nodes", "driver", "cuda_runtime", "torch",
             "triton", "python", "gdnval", "platform")


def _repetitions(session: Session, job_id: int, cases: list[Any]) -> views.ValuesOf | None:
    """The job's repetitions for the intervals of its speed-ups and gains, when it timed anything."""
    if not any(m.kind == "time" for c in cases for m in c.metrics.values()):
        return None
    return job_repetitions(session, job_id)


def _info_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _job_facts(job: JobRow, now: datetime) -> dict[str, Any]:
    info = job.info or {}
    shown = [k for k in INFO_KEYS if info.get(k) not in (None, "", [], {})]
    items = [(k, _info_text(info[k])) for k in shown]
    more = [(k, _info_text(v)) for k, v in sorted(info.items())
            if k not in shown and k != "backends" and v not in (None, "", [], {})]  # backends: own row
    return {
        "id": job.id, "suite": job.suite, "preset": job.preset, "params": job.params or {},
        "labels": job.labels or {}, "commit": job.code_commit, "device": job.device,
        "world_size": job.world_size, "status": job.status, "error": job.error,
        "progress_done": job.progress_done, "progress_total": job.progress_total,
        "progress_message": job.progress_message, "created": when(job.created_at),
        "started": when(job.started_at), "finished": when(job.finished_at),
        "duration": views.duration(job.started_at, job.finished_at, now if job.status == "running" else None),
        "info_items": items, "info_more": more,
        "run_commit": info.get("commit") if isinstance(info.get("commit"), str) else None,
        "verdict": job.verdict, "case_counts": job.case_counts or {}, "cases": job.cases,
        "backend_commit": job.backend_commit,
    }


PAGE_POINTS = 5000  # repetition dots per job page; more lanes -> each lane subsampled harder
MIN_LANE_POINTS = 10


def _plots(
    session: Session, job: JobRow, cases: list[summary_store.CaseSummary], only: set[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Per case fingerprint (of `only`, else every case): the timing distribution and the
    trajectory errors, as SVG. The point budget is the whole job's, so a case drawn alone looks
    as it does among the others.

    The summaries say how many samples each lane holds, so the queries ask only for what is
    drawn: at most PAGE_POINTS repetition dots per page (every k-th repetition of a long lane,
    filtered in SQL) and at most MAX_STEPS vertices per trajectory (worst per bin, in SQL)."""
    mdefs = sample_store.metrics_of_kinds(session, job.suite, ("time", "trajectory"))
    if not mdefs:
        return {}
    by_name = {m.name: m for m in mdefs}
    timed_ids = {m.id: (m.name, m.direction) for m in mdefs
                 if m.kind == "time" and m.unit in views.TIME_UNITS}
    traj_ids = {m.id: (m.name, m.direction) for m in mdefs if m.kind == "trajectory"}
    lanes_total = sum(ms.ranks for c in cases for ms in c.metrics.values()
                      if ms.metric in by_name and by_name[ms.metric].id in timed_ids)
    cap = max(MIN_LANE_POINTS, min(charts.MAX_POINTS, PAGE_POINTS // max(lanes_total, 1)))
    strides: dict[int, int] = {}  # per metric: the longest lane decides
    bins: dict[int, int] = {}
    sizes: dict[tuple[int, str], tuple[int, int]] = {}
    for c in cases:
        for ms in c.metrics.values():
            m = by_name.get(ms.metric)
            if m is None:
                continue
            sizes[(c.case_id, ms.metric)] = (ms.count, ms.ranks)
            if m.id in timed_ids and ms.count > cap:
                strides[m.id] = max(strides.get(m.id, 1), math.ceil(ms.count / cap))
            elif m.id in traj_ids and ms.count > charts.MAX_STEPS:
                bins[m.id] = max(bins.get(m.id, 1), math.ceil(ms.count / charts.MAX_STEPS))
    attempt = max(1, job.attempts)
    case_ids = [c.case_id for c in cases if only is None or c.fingerprint in only]
    timing = page_queries.timing_groups(session, job.id, attempt, case_ids, timed_ids, strides)
    steps = page_queries.step_groups(session, job.id, attempt, case_ids, traj_ids, bins)
    names = {c.case_id: (c.fingerprint, c.name) for c in cases}
    out: dict[str, list[dict[str, Any]]] = {}
    per_case: dict[int, list[page_queries.Group]] = {}
    for g in timing:
        per_case.setdefault(g.case_id, []).append(g)
    for cid, gs in per_case.items():
        if cid not in names:
            continue
        fp, cname = names[cid]
        unit = by_name[gs[0].metric].unit
        lanes = [charts.Lane(g.metric, r, v) for g in gs for r, v in sorted(g.lanes.items())]
        drawn = sum(v.size for g in gs for v in g.lanes.values())
        total = sum(sizes.get((cid, g.metric), (0, 0))[0] * sizes.get((cid, g.metric), (0, 0))[1] for g in gs)
        ranks = max(len(g.lanes) for g in gs)
        k = max((strides.get(by_name[g.metric].id, 1) for g in gs), default=1)
        what = (f"every repetition of every rank ({drawn} samples, {ranks} rank(s))" if k == 1 else
                f"every {k}th repetition of every rank ({drawn} of {total} samples, {ranks} rank(s))")
        svg = charts.timing_distribution(lanes, {g.metric: g.worst for g in gs}, unit=unit,
                                         title=f"Timing distribution of {cname}")
        out.setdefault(fp, []).append({
            "kind": "timing", "svg": svg,
            "caption": f"Dots: {what}. Box: the slowest rank of each repetition shown "
                       "(p25–p75, median line, p90 tick, whiskers min–max); exact statistics in the tables.",
        })
    per_case = {}
    for g in steps:
        per_case.setdefault(g.case_id, []).append(g)
    for cid, gs in per_case.items():
        if cid not in names:
            continue
        fp, cname = names[cid]
        # one chart per unit: relative errors, absolute errors, losses (nats), norms never share an axis
        by_unit: dict[str, list[page_queries.Group]] = {}
        for g in gs:
            by_unit.setdefault(by_name[g.metric].unit, []).append(g)
        for unit, ug in by_unit.items():
            series = [charts.Trajectory(g.metric, g.idx, g.worst, by_name[g.metric].bound,
                                        per_bin=bins.get(by_name[g.metric].id, 1)) for g in ug]
            what = {"ratio": "relative error", "abs": "absolute error"}.get(unit, unit or "value")
            svg = charts.trajectory_chart(series, title=f"{cname}: {what} per step",
                                          unit=views.shown_unit(unit))
            n_steps = max(sizes.get((cid, g.metric), (g.idx.size, 1))[0] for g in ug)
            out.setdefault(fp, []).append({
                "kind": "trajectory", "svg": svg,
                "caption": f"{what.capitalize()}: {len(ug)} series over {n_steps} steps, the worst rank of "
                           "each step; dashed: bound; ✕: a non-finite step.",
            })
    return out


def _plottable(cases: list[summary_store.CaseSummary]) -> set[str]:
    """The cases with a timing lane or a trajectory to draw (their plots load with the case)."""
    return {c.fingerprint for c in cases for m in c.metrics.values()
            if m.kind == "trajectory" or (m.kind == "time" and m.unit in views.TIME_UNITS)}


@router.get("/jobs/{job_id}/plots", response_class=HTMLResponse)
def job_plots(
    request: Request, job_id: DbId, case: str, session: Session = Depends(get_session)
) -> HTMLResponse:
    """One case's plots as an HTML fragment: the job page fetches it when the case comes near
    the screen, so a 100k-sample page is not ~700 KiB of inline SVG before anyone looks."""
    job = job_store.get_job(session, job_id)
    if job is None:
        return error_page(request, 404, "No such job", f"There is no job #{job_id}.")
    cases = summary_store.case_summaries(session, job_id)
    if case not in {c.fingerprint for c in cases}:
        return error_page(request, 404, "No such case", f"Job #{job_id} has no case {case!r}.")
    plots = _plots(session, job, cases, only={case}).get(case, [])
    return page(request, "_plots.html", plots=plots)


def _case_counts(cases: list[views.CaseView]) -> list[tuple[str, str, int]]:
    counts: dict[tuple[str, str], int] = {}
    for c in cases:
        counts[(c.status, c.status_class)] = counts.get((c.status, c.status_class), 0) + 1
    return [(w, css, n) for (w, css), n in sorted(counts.items())]


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(
    request: Request, job_id: DbId, settings: SettingsDep, session: Session = Depends(get_session)
) -> HTMLResponse:
    job = job_store.get_job(session, job_id)
    if job is None:
        return error_page(request, 404, "No such job", f"There is no job #{job_id}.")
    cases = summary_store.case_summaries(session, job_id)
    cviews = views.case_views(cases)
    acc = views.accuracy_rows(cases)
    artifacts = [
        {"name": a.name, "url": artifact_url(job_id, a.name),
         "size": views.human_bytes(a.size, "bytes")}
        for a in artifact_store.list_artifacts(session, job_id)
    ]
    prev = page_queries.previous_job(session, job)
    plotted = ("time", "memory", "trajectory")
    history_metrics = {
        c.fingerprint: [m.metric for m in c.metrics.values() if m.kind in plotted][:4] for c in cases
    }
    return page(
        request, "job.html", nav="jobs", job=_job_facts(job, utc_now()), cases=cviews,
        case_counts=_case_counts(cviews), acc_rows=acc, acc_columns=views.ACCURACY_COLUMNS,
        acc_other=any("other" in r.cells for r in acc),
        speed_rows=views.speed_rows(cases, _repetitions(session, job_id, cases), job.device),
        mem_rows=views.memory_rows(cases, tracked=memory_tracked(job.device)),
        traj_rows=views.value_rows(cases, "trajectory"),
        check_rows=views.value_rows(cases, "check"), plotted=_plottable(cases),
        artifacts=artifacts, history_metrics=history_metrics, previous=prev.id if prev else None,
        history_repo=urlencode({"backend_repo": repo}) if (repo := queue.job_backend_repo(job)) else "",
        deadline=_deadline(settings, job), case_backends=views.case_backends(cases),
        backend_records=views.backend_records(job.info or {}, job.commit_sha),
        gates=gate_store.gates_of_jobs(session, [job.id]).get(job.id, []),
        finds=find_store.finds_of_jobs(session, [job.id]).get(job.id, []),
        downloads={"csv": api_samples_url(job_id, "csv"), "json": api_samples_url(job_id, "json"),
                   "report": f"/jobs/{job_id}/report.md"},
    )


def _deadline(settings: Settings, job: JobRow) -> str:
    """The job's wall-clock limit as it runs (recorded at start) or will run (computed the same way)."""
    seconds = (job.info or {}).get("deadline_s")
    try:
        if seconds is None:
            seconds = job_deadline_s(get_suite(job.suite), job.preset, job.params, job.world_size,
                                     settings.job_deadline_s)
    except Exception as exc:  # an unloadable suite: say so instead of hiding the fact
        return f"unknown ({type(exc).__name__}: {exc})"
    origin = "service setting" if settings.job_deadline_s else "suite default"
    start = datetime(2000, 1, 1, tzinfo=UTC)
    return f"{views.duration(start, start + timedelta(seconds=float(seconds)))} ({origin})"


@router.get("/jobs/{job_id}/report.md")
def job_report(job_id: DbId, settings: SettingsDep, session: Session = Depends(get_session)) -> Response:
    """The job's Markdown test report (the same text `gdnval report` prints), linked only under
    the configured public URL."""
    if job_store.get_job(session, job_id) is None:
        raise HTTPException(404, f"no job #{job_id}")
    text, _ = build_report(session, [job_id], base_url=settings.public_url or "")
    return Response(text, media_type="text/markdown; charset=utf-8",
                    headers={"Content-Disposition": f'inline; filename="gdnval-job-{job_id}.md"'})


@router.get("/compare/report.md")
def compare_report(
    base: DbIdQuery, head: DbIdQuery, settings: SettingsDep, session: Session = Depends(get_session)
) -> Response:
    """The Markdown report of `head` compared with `base` (job ids)."""
    for job_id in (base, head):
        if job_store.get_job(session, job_id) is None:
            raise HTTPException(404, f"no job #{job_id}")
    try:
        text, _ = build_report(session, [head], [base], base_url=settings.public_url or "")
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    return Response(text, media_type="text/markdown; charset=utf-8",
                    headers={"Content-Disposition": f'inline; filename="gdnval-{base}-vs-{head}.md"'})


@router.get("/jobs/{job_id}/progress")
def job_progress(job_id: DbId, session: Session = Depends(get_session)) -> JSONResponse:
    """What the job page's script polls while the job is queued or running."""
    job = job_store.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, f"no job #{job_id}")
    return JSONResponse(
        {"status": job.status, "done": job.progress_done, "total": job.progress_total,
         "message": job.progress_message, "final": job.status in FINAL_STATUSES},
        headers={"Cache-Control": "no-store"},
    )
