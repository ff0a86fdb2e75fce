"""The results pages: jobs, job, compare, history, suites. Server-rendered (Jinja2), no CDN.

`service.app.create_app` includes `router` when this module exists. Pages read through
`service.persistence` (`page_queries` for plot data), shape rows with `service.domain.views` and
draw with `service.web.charts`; the only JavaScript polls a partial endpoint for live progress.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.domain import views
from service.domain.numbers import fmt
from service.persistence import page_queries, store
from service.persistence.artifacts import artifact_url
from service.persistence.models import FINAL_STATUSES, JOB_STATUSES, CaseRow, JobRow, MetricRow
from service.web import charts
from service.web_session import COOKIE, has_session, session_keys
from workers import verdict
from workers.suite import PRESETS

HERE = Path(__file__).resolve().parent.parent  # service/web: templates/ and static/
STATIC = HERE / "static"
DEVICES: tuple[str, ...] = ("cuda", "npu", "cpu")

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["fmt"] = fmt
templates.env.globals["pct"] = views.progress_percent

router = APIRouter(include_in_schema=False)


# ----------------------------------------------------------------------------------- plumbing


def get_session(request: Request) -> Iterator[Session]:
    """A read session on the app's store engine, closed after the response."""
    engine = request.app.state.engine
    with Session(engine) as session:
        yield session


def _settings(request: Request) -> Any:
    return request.app.state.settings


def require_page_read(request: Request) -> None:
    """With `protect_reads`, pages need the login cookie (browsers cannot send the API's bearer
    header on a link); without it the reader is sent to /login and back."""
    settings = _settings(request)
    token = settings.token()
    if not settings.protect_reads or token is None:
        return
    if has_session(request, token):
        return
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    raise HTTPException(303, "log in first", headers={"Location": "/login?" + urlencode({"next": target})})


pages = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])


def _page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def _error(request: Request, status_code: int, title: str, detail: str) -> HTMLResponse:
    return _page(request, "error.html", status_code, nav="", code=status_code, title=title, detail=detail)


def _when(value: datetime | None) -> str | None:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else None


def _now() -> datetime:
    return datetime.now(UTC)


def _suite_names() -> list[str]:
    from workers.registry import suite_names

    return suite_names()


def _api_samples(job_id: int, fmt: str) -> str:
    return f"/api/v1/jobs/{job_id}/samples?{urlencode({'format': fmt})}"


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


# ------------------------------------------------------------------------------------ jobs list


def _job_row(job: JobRow, counts: dict[str, int], now: datetime) -> dict[str, Any]:
    word, css = views.job_verdict(job.status, job.verdict, counts)
    return {
        "id": job.id,
        "status": job.status,
        "progress_done": job.progress_done,
        "progress_total": job.progress_total,
        "suite": job.suite,
        "preset": job.preset,
        "commit": job.commit_sha,
        "device": job.device,
        "world_size": job.world_size,
        "created": _when(job.created_at),
        "duration": views.duration(job.started_at, job.finished_at, now if job.status == "running" else None),
        "verdict": word,
        "verdict_class": css,
    }


def _jobs_context(session: Session, status: str | None, suite: str | None, commit: str | None,
                  before: int | None) -> dict[str, Any]:
    status = status if status in JOB_STATUSES else None
    jobs, nxt = store.list_jobs(session, status=status or None, suite=suite or None, commit=commit or None,
                                before_id=before, limit=50)
    counts = page_queries.job_case_counts(session, [j.id for j in jobs])
    now = _now()
    rows = [_job_row(j, counts.get(j.id, {}), now) for j in jobs]
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


@pages.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, status: str | None = None, suite: str | None = None,
              commit: str | None = None, before: int | None = None,
              session: Session = Depends(get_session)) -> HTMLResponse:
    ctx = _jobs_context(session, status, suite, commit, before)
    known = sorted(set(_suite_names()) | set(page_queries.suites_with_results(session)))
    return _page(request, "jobs.html", nav="jobs", statuses=JOB_STATUSES, suites=known,
                 presets=PRESETS, devices=DEVICES, form={"device": "cpu", "preset": "quick"}, form_open=False,
                 message=None, **ctx)


@pages.get("/jobs/rows", response_class=HTMLResponse)
def jobs_rows(request: Request, status: str | None = None, suite: str | None = None,
              commit: str | None = None, before: int | None = None,
              session: Session = Depends(get_session)) -> HTMLResponse:
    """The job list's rows alone: the page's script swaps them in while jobs are live."""
    ctx = _jobs_context(session, status, suite, commit, before)
    resp = _page(request, "_job_rows.html", **ctx)
    resp.headers["X-Active-Jobs"] = str(ctx["active"])
    resp.headers["Cache-Control"] = "no-store"
    return resp


@pages.post("/jobs/new", response_class=HTMLResponse)
def submit_job(
    request: Request,
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
        known = sorted(set(_suite_names()) | set(page_queries.suites_with_results(session)))
        return _page(request, "jobs.html", status_code, nav="jobs", statuses=JOB_STATUSES, suites=known,
                     presets=PRESETS, devices=DEVICES, form=form, form_open=True, message=message,
                     message_class="bad", **ctx)

    expected = _settings(request).token()
    if expected is not None and not hmac.compare_digest(token.encode(), expected.encode()):
        return again(401, "Wrong or missing API token: the job was not submitted.")
    try:
        body = {
            "suite": suite, "preset": preset, "commit": commit.strip() or None, "device": device,
            "world_size": world_size, "priority": priority,
            "params": json.loads(params or "{}"), "labels": json.loads(labels or "{}"),
        }  # fmt: skip
    except json.JSONDecodeError as exc:
        return again(422, f"Parameters and labels must be JSON objects: {exc}")
    from pydantic import ValidationError

    from service.persistence import queue

    state = request.app.state
    try:  # the API's own submit path: same validation, same queue
        job, _ = queue.submit_checked(state.engine, state.settings, body, state.executor)
    except ValidationError as exc:
        return again(422, "Not submitted: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()))
    except (queue.InvalidJob, queue.JobConflict, ValueError) as exc:
        return again(422, f"Not submitted: {exc}")
    dispatcher = getattr(state, "dispatcher", None)
    if dispatcher is not None:
        dispatcher.wake()
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


# ------------------------------------------------------------------------------------- job page


# What a reader compares between two runs first; the rest of the run info is one click away.
INFO_KEYS = ("device_name", "device_count", "driver", "cuda_runtime", "torch", "triton", "python", "gdnval",
             "platform")


def _info_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _job_facts(job: JobRow, now: datetime) -> dict[str, Any]:
    info = job.info or {}
    shown = [k for k in INFO_KEYS if info.get(k) not in (None, "", [], {})]
    items = [(k, _info_text(info[k])) for k in shown]
    more = [(k, _info_text(v)) for k, v in sorted(info.items())
            if k not in shown and v not in (None, "", [], {})]
    return {
        "id": job.id, "suite": job.suite, "preset": job.preset, "params": job.params or {},
        "labels": job.labels or {}, "commit": job.commit_sha, "device": job.device,
        "world_size": job.world_size, "status": job.status, "error": job.error,
        "progress_done": job.progress_done, "progress_total": job.progress_total,
        "progress_message": job.progress_message, "created": _when(job.created_at),
        "started": _when(job.started_at), "finished": _when(job.finished_at),
        "duration": views.duration(job.started_at, job.finished_at, now if job.status == "running" else None),
        "info_items": items, "info_more": more,
        "run_commit": info.get("commit") if isinstance(info.get("commit"), str) else None,
        "verdict": job.verdict, "case_counts": job.case_counts or {}, "cases": job.cases,
    }  # fmt: skip


PAGE_POINTS = 5000  # repetition dots per job page; more lanes -> each lane subsampled harder
MIN_LANE_POINTS = 10


def _plots(
    session: Session, job: JobRow, cases: list[store.CaseSummary], only: set[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Per case fingerprint (of `only`, else every case): the timing distribution and the
    trajectory errors, as SVG. The point budget is the whole job's, so a case drawn alone looks
    as it does among the others.

    The summaries say how many samples each lane holds, so the queries ask only for what is
    drawn: at most PAGE_POINTS repetition dots per page (every k-th repetition of a long lane,
    filtered in SQL) and at most MAX_STEPS vertices per trajectory (worst per bin, in SQL)."""
    mdefs = session.execute(
        select(MetricRow.id, MetricRow.name, MetricRow.direction, MetricRow.kind, MetricRow.unit,
               MetricRow.bound)
        .where(MetricRow.suite == job.suite, MetricRow.kind.in_(("time", "trajectory")))
    ).all()
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
        })  # fmt: skip
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
            })  # fmt: skip
    return out


def _plottable(cases: list[store.CaseSummary]) -> set[str]:
    """The cases with a timing lane or a trajectory to draw (their plots load with the case)."""
    return {c.fingerprint for c in cases for m in c.metrics.values()
            if m.kind == "trajectory" or (m.kind == "time" and m.unit in views.TIME_UNITS)}  # fmt: skip


@pages.get("/jobs/{job_id}/plots", response_class=HTMLResponse)
def job_plots(
    request: Request, job_id: int, case: str, session: Session = Depends(get_session)
) -> HTMLResponse:
    """One case's plots as an HTML fragment: the job page fetches it when the case comes near
    the screen, so a 100k-sample page is not ~700 KiB of inline SVG before anyone looks."""
    job = store.get_job(session, job_id)
    if job is None:
        return _error(request, 404, "No such job", f"There is no job #{job_id}.")
    cases = store.case_summaries(session, job_id)
    if case not in {c.fingerprint for c in cases}:
        return _error(request, 404, "No such case", f"Job #{job_id} has no case {case!r}.")
    plots = _plots(session, job, cases, only={case}).get(case, [])
    return _page(request, "_plots.html", plots=plots)


def _case_counts(cases: list[views.CaseView]) -> list[tuple[str, str, int]]:
    counts: dict[tuple[str, str], int] = {}
    for c in cases:
        counts[(c.status, c.status_class)] = counts.get((c.status, c.status_class), 0) + 1
    return [(w, css, n) for (w, css), n in sorted(counts.items())]


@pages.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: int, session: Session = Depends(get_session)) -> HTMLResponse:
    job = store.get_job(session, job_id)
    if job is None:
        return _error(request, 404, "No such job", f"There is no job #{job_id}.")
    cases = store.case_summaries(session, job_id)
    cviews = views.case_views(cases)
    acc = views.accuracy_rows(cases)
    artifacts = [
        {"name": a.name, "url": artifact_url(job_id, a.name),
         "size": views.human_bytes(a.size, "bytes")}
        for a in store.list_artifacts(session, job_id)
    ]  # fmt: skip
    prev = page_queries.previous_job(session, job)
    plotted = ("time", "memory", "trajectory")
    history_metrics = {
        c.fingerprint: [m.metric for m in c.metrics.values() if m.kind in plotted][:4] for c in cases
    }
    return _page(
        request, "job.html", nav="jobs", job=_job_facts(job, _now()), cases=cviews,
        case_counts=_case_counts(cviews), acc_rows=acc, acc_columns=views.ACCURACY_COLUMNS,
        acc_other=any("other" in r.cells for r in acc), speed_rows=views.speed_rows(cases),
        mem_rows=views.memory_rows(cases), traj_rows=views.value_rows(cases, "trajectory"),
        check_rows=views.value_rows(cases, "check"), plotted=_plottable(cases),
        artifacts=artifacts, history_metrics=history_metrics, previous=prev.id if prev else None,
        deadline=_deadline(request, job),
        downloads={"csv": _api_samples(job_id, "csv"), "json": _api_samples(job_id, "json"),
                   "report": f"/jobs/{job_id}/report.md"},
    )  # fmt: skip


def _deadline(request: Request, job: JobRow) -> str:
    """The job's wall-clock limit as it runs (recorded at start) or will run (computed the same way)."""
    from workers.deadline import job_deadline_s
    from workers.registry import get_suite

    seconds = (job.info or {}).get("deadline_s")
    try:
        if seconds is None:
            seconds = job_deadline_s(get_suite(job.suite), job.preset, job.params, job.world_size,
                                     request.app.state.settings.job_deadline_s)  # fmt: skip
    except Exception as exc:  # an unloadable suite: say so instead of hiding the fact
        return f"unknown ({type(exc).__name__}: {exc})"
    origin = "service setting" if request.app.state.settings.job_deadline_s else "suite default"
    start = datetime(2000, 1, 1, tzinfo=UTC)
    return f"{views.duration(start, start + timedelta(seconds=float(seconds)))} ({origin})"


@pages.get("/jobs/{job_id}/report.md")
def job_report(request: Request, job_id: int, session: Session = Depends(get_session)) -> Response:
    """The job's Markdown test report (the same text `gdnval report` prints)."""
    from service.domain.report import build_report

    if store.get_job(session, job_id) is None:
        raise HTTPException(404, f"no job #{job_id}")
    text, _ = build_report(session, [job_id], base_url=str(request.base_url).rstrip("/"))
    return Response(text, media_type="text/markdown; charset=utf-8",
                    headers={"Content-Disposition": f'inline; filename="gdnval-job-{job_id}.md"'})


@pages.get("/compare/report.md")
def compare_report(
    request: Request, base: int, head: int, session: Session = Depends(get_session)
) -> Response:
    """The Markdown report of `head` compared with `base` (job ids)."""
    from service.domain.report import build_report

    for job_id in (base, head):
        if store.get_job(session, job_id) is None:
            raise HTTPException(404, f"no job #{job_id}")
    try:
        text, _ = build_report(session, [head], [base], base_url=str(request.base_url).rstrip("/"))
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    return Response(text, media_type="text/markdown; charset=utf-8",
                    headers={"Content-Disposition": f'inline; filename="gdnval-{base}-vs-{head}.md"'})


@pages.get("/jobs/{job_id}/progress")
def job_progress(job_id: int, session: Session = Depends(get_session)) -> JSONResponse:
    """What the job page's script polls while the job is queued or running."""
    job = store.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, f"no job #{job_id}")
    return JSONResponse(
        {"status": job.status, "done": job.progress_done, "total": job.progress_total,
         "message": job.progress_message, "final": job.status in FINAL_STATUSES},
        headers={"Cache-Control": "no-store"},
    )  # fmt: skip


# -------------------------------------------------------------------------------------- compare


def _resolve_side(session: Session, text: str, suite: str | None, device: str | None,
                  other: JobRow | None) -> JobRow:
    """A job id ('12' or '#12'), a named baseline, or a commit (prefix): the newest succeeded job
    of the suite there."""
    t = text.strip().lstrip("#")
    if t.isdigit() and len(t) < 7:
        job = store.get_job(session, int(t))
        if job is None:
            raise LookupError(f"there is no job #{t}")
        return job
    named = store.get_baseline(session, t)
    if named is not None:
        if named.job_id is not None:
            job = store.get_job(session, named.job_id)
            if job is None:
                raise LookupError(f"baseline {t!r} points at job #{named.job_id}, which is gone")
            return job
        if named.commit is None:
            raise LookupError(f"baseline {t!r} points at nothing")
        t = named.commit.sha
    suite = suite or (other.suite if other else None)
    if not suite:
        raise LookupError(f"{text!r} looks like a commit: pick a suite (or give a job id on the other side)")
    device = device or (other.device if other else None)
    job = store.latest_job_for_commit(session, t, suite, device=device or None,
                                      preset=other.preset if other else None)
    if job is None:
        raise LookupError(f"no succeeded {suite} job at commit {t!r}" + (f" on {device}" if device else ""))
    return job


def _num(value: float | None, unit: str = "") -> str:
    return fmt(value, unit) if value is not None else "–"


@pages.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, base: str | None = None, head: str | None = None,
                 suite: str | None = None, device: str | None = None, show: str = "changes",
                 session: Session = Depends(get_session)) -> HTMLResponse:
    recent = [{"id": j.id, "suite": j.suite, "preset": j.preset, "commit": j.commit_sha, "device": j.device}
              for j in store.list_jobs(session, status="succeeded", limit=30)[0]]
    baselines = [b.name for b in store.list_baselines(session)]
    show = show if show in views.COMPARE_VIEWS else "changes"
    form = {"base": base, "head": head, "suite": suite, "device": device, "show": show}
    ctx: dict[str, Any] = {"nav": "compare", "form": form, "recent": recent, "devices": DEVICES,
                           "suites": sorted(set(_suite_names())
                                            | set(page_queries.suites_with_results(session))),
                           "cmp": None, "error": None, "views_available": list(views.COMPARE_VIEWS.items()),
                           "baselines": baselines}
    if not base or not head:
        return _page(request, "compare.html", **ctx)
    try:
        hint = None
        if head.strip().lstrip("#").isdigit():
            hint = _resolve_side(session, head, suite, device, None)
        base_job = _resolve_side(session, base, suite, device, hint)
        head_job = hint or _resolve_side(session, head, suite, device, base_job)
        if base_job.suite != head_job.suite:
            raise LookupError(f"job #{base_job.id} ran {base_job.suite!r} but job #{head_job.id} ran "
                              f"{head_job.suite!r}: compare jobs of one suite")
    except LookupError as exc:
        ctx["error"] = str(exc)
        return _page(request, "compare.html", 404, **ctx)
    try:
        cmp = _compare(session, base_job.id, head_job.id)
    except ValueError as exc:  # the engine refuses these inputs: say why instead of a bare 500
        ctx["error"] = f"Could not compare job #{base_job.id} with job #{head_job.id}: {exc}"
        return _page(request, "compare.html", 422, **ctx)
    q = {k: v for k, v in form.items() if v and k != "show"}
    ctx.update(
        cmp=cmp, rows=views.compare_rows(cmp, show), counts=list(cmp.counts().items()),
        metric_counts=list(cmp.metric_counts().items()),
        view_links=[(key, label, "/compare?" + urlencode({**q, "show": key}))
                    for key, label in views.COMPARE_VIEWS.items()],
    )  # fmt: skip
    return _page(request, "compare.html", **ctx)


def _compare(session: Session, base_id: int, head_id: int) -> Any:
    """The compare engine over two stored jobs (the loader turns jobs into sides)."""
    from service.domain.baselines import compare_jobs

    return compare_jobs(session, base_id, head_id)


# -------------------------------------------------------------------------------------- history


@pages.get("/history", response_class=HTMLResponse)
def history_page(request: Request, fingerprint: str | None = None, metric: str | None = None,
                 session: Session = Depends(get_session)) -> HTMLResponse:
    suites = page_queries.suites_with_results(session)
    if not fingerprint:
        return _page(request, "history.html", nav="history", series=None, missing=None, suites=suites)
    case = session.scalar(select(CaseRow).where(CaseRow.fingerprint == fingerprint))
    if case is None:
        return _page(request, "history.html", 404, nav="history", series=None, suites=suites,
                     missing=f"No case with fingerprint {fingerprint!r}.")
    names = page_queries.case_metric_names(session, fingerprint)
    if not names:
        return _page(request, "history.html", 404, nav="history", series=None, suites=suites,
                     missing=f"Case {case.name!r} has no samples yet.")
    metric = metric if metric in names else names[0]
    mdef = session.scalar(select(MetricRow).where(MetricRow.suite == case.suite, MetricRow.name == metric))
    unit = mdef.unit if mdef else ""
    stats = page_queries.series_summaries(session, case.id, mdef.id) if mdef else []
    if not stats:  # jobs stored without summaries (not run by the service): reduce the raw samples
        raw = store.fingerprint_series(session, fingerprint, metric)
        stats = [_raw_stat(job, worst.values) for job, worst in raw]
    points: list[charts.SeriesPoint] = []
    rows: list[dict[str, Any]] = []
    prev: float | None = None
    for st in stats:
        job = st.job
        ok = st.count > 0 and st.median == st.median
        med, lo, p90, hi = (st.median, st.min, st.p90, st.max) if ok else (None, None, None, None)
        label = (job.commit_sha or f"#{job.id}")[:8]
        href = f"/jobs/{job.id}#case-{fingerprint}"
        points.append(charts.SeriesPoint(label, med, lo, p90, st.count, href))
        change = views.Cell("–")
        if med is not None and prev not in (None, 0.0):
            r = med / prev - 1
            worse = r > 0.05 if (mdef is None or mdef.direction == "lower") else r < -0.05
            better = r < -0.05 if (mdef is None or mdef.direction == "lower") else r > 0.05
            change = views.Cell(f"{r:+.1%}", "bad" if worse else ("ok" if better else "none"),
                                "worse" if worse else ("better" if better else ""))
        rows.append({"job": job.id, "commit": label, "finished": _when(job.finished_at),
                     "median": _num(med, unit), "min": _num(lo), "p90": _num(p90), "max": _num(hi),
                     "n": st.count, "change": change})
        prev = med if med is not None else prev
    svg = charts.history_line(points, unit=unit, bound=mdef.bound if mdef else None,
                              title=f"{case.name}: {metric} across commits")
    series = {"case": case.name, "suite": case.suite, "device": case.device, "world_size": case.world_size,
              "fingerprint": fingerprint, "metric": metric, "metrics": names, "points": points, "rows": rows,
              "svg": svg, "spread": "min to p90"}
    return _page(request, "history.html", nav="history", series=series, missing=None, suites=suites)


def _raw_stat(job: JobRow, values: Any) -> page_queries.SeriesStat:
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or np.isnan(v).any():
        nan = float("nan")
        return page_queries.SeriesStat(job, int(v.size), nan, nan, nan, nan)
    return page_queries.SeriesStat(job, int(v.size), float(np.median(v)), float(v.min()),
                              float(np.percentile(v, 90)), float(v.max()))


@pages.get("/history/{suite}", response_class=HTMLResponse)
def history_suite(request: Request, suite: str, kind: str = "time", device: str | None = None,
                  world_size: int | None = None, last: int = 20,
                  session: Session = Depends(get_session)) -> HTMLResponse:
    kinds = ("time", "memory", "accuracy", "trajectory", "check")
    kind = kind if kind in kinds else "time"
    last = min(max(last, 2), 200)
    series = page_queries.suite_overview(session, suite, kind, device=device or None, world_size=world_size,
                                    last=last)
    rows = []
    for s in series:
        meds = s.medians
        change = views.Cell("–")
        if len(meds) >= 2 and meds[-2] and meds[-1] == meds[-1] and meds[-2] == meds[-2]:
            r = meds[-1] / meds[-2] - 1
            effect = verdict.min_effect(kind, getattr(s, "min_effect", None), s.device)
            moved = verdict.classify_change(kind, s.direction, meds[-2], meds[-1], effect)
            worse, better = moved == "worse", moved == "better"
            change = views.Cell(f"{r:+.1%}", "bad" if worse else ("ok" if better else "none"),
                                "worse" if worse else ("better" if better else ""),
                                f"minimum effect {effect:.0%} for {kind} on {s.device}")
        rows.append({
            "case": s.case, "fingerprint": s.fingerprint, "metric": s.metric, "device": s.device,
            "world_size": s.world_size, "n": len(meds), "latest": _num(meds[-1] if meds else None, s.unit),
            "change": change,
            "spark": charts.sparkline(meds, title=f"{s.case} {s.metric} over the last {len(meds)} jobs",
                                      unit=s.unit),
        })  # fmt: skip
    return _page(request, "history_suite.html", nav="history", suite=suite, kind=kind, kinds=kinds,
                 device=device, devices=DEVICES, world_size=world_size, last=last, rows=rows)


# --------------------------------------------------------------------------------------- suites


@pages.get("/suites", response_class=HTMLResponse)
def suites_page(request: Request) -> HTMLResponse:
    from workers.registry import get_suite

    out = []
    for name in _suite_names():
        try:
            d = get_suite(name).describe()
        except Exception as exc:  # a broken suite module must not take the catalogue down
            out.append({"name": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        for m in d["metrics"]:
            bound = m.get("bound")
            rel = "≤" if m.get("direction") == "lower" else "≥"
            unit = views.shown_unit(m.get("unit", ""))
            m["bound_text"] = f"{rel} {fmt(bound, unit)}" if bound is not None else "–"
        for p in d["presets"].values():
            for c in p["cases"]:
                c["short"] = views.short_params(c["params"], limit=12)
        out.append(d)
    return _page(request, "suites.html", nav="suites", suites=out)


# ---------------------------------------------------------------------------------------- login


def _safe_next(target: str | None) -> str:
    """Only a path on this site (no scheme, no '//host'): an open redirect is not a feature."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/jobs"
    return target


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str | None = None) -> HTMLResponse:
    return _page(request, "login.html", nav="", next=_safe_next(next), message=None)


@router.post("/login", response_class=HTMLResponse)
def login(request: Request, token: str = Form(""), next: str = Form("/jobs")) -> Response:
    """Trade the API token for a session cookie (HttpOnly, SameSite=Lax) so pages can be read."""
    expected = _settings(request).token()
    target = _safe_next(next)
    if expected is None:
        return RedirectResponse(target, status_code=303)
    if not hmac.compare_digest(token.encode(), expected.encode()):
        return _page(request, "login.html", 401, nav="", next=target, message="Wrong token.")
    keys = session_keys(request)
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(COOKIE, keys.issue(expected), max_age=int(keys.ttl_s), httponly=True, samesite="lax",
                    secure=request.url.scheme == "https", path="/")  # fmt: skip
    return resp


@router.get("/logout")
def logout(request: Request) -> RedirectResponse:
    """End the session: revoked on the server (a copied cookie stops working too), dropped here."""
    token = _settings(request).token()
    given = request.cookies.get(COOKIE, "")
    if token is not None and given:
        session_keys(request).revoke(token, given)
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/")
    return resp


router.include_router(pages)

