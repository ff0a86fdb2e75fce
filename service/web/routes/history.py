"""`/history`: a repository's commits in first-parent order with one point per measured commit,
each judged against the commit measured before it by the compare engine
(`service.domain.history`); one series (a case's metric) as a chart and a table, or every
series of a suite as sparklines. `/history/{suite}` is the same page for that suite."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy.orm import Session

from service.api.deps import DbIntQuery, get_session
from service.domain.commit_range import RangeError
from service.domain.history import SeriesFilter, repository_history
from service.persistence import cases as case_store
from service.persistence import page_queries
from service.persistence.jobs import backend_repositories
from service.presentation import history_view
from service.web import charts
from service.web.deps import DEVICES, page, require_page_read
from workers.refs import InvalidCommitRef

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])
KINDS = ("time", "memory", "accuracy", "trajectory", "check")


@router.get("/history", response_class=HTMLResponse)
def history_page(
    request: Request, suite: str | None = None, backend_repo: str | None = None,
    fingerprint: str | None = None, case: str | None = None, metric: str | None = None,
    backend: str | None = None, kind: str | None = None, device: str | None = None,
    world_size: DbIntQuery | None = None, setting: str | None = None,
    tip: str = "HEAD", last: int = 50, session: Session = Depends(get_session),
) -> HTMLResponse:
    """`fingerprint` names one case (its suite, device and world size follow from it)."""
    form: dict[str, Any] = {
        "suite": suite or "", "backend_repo": backend_repo or "", "case": case or "", "metric": metric or "",
        "backend": backend or "", "kind": kind if kind in KINDS else "", "device": device or "",
        "world_size": world_size or "", "setting": setting or "", "tip": tip, "last": min(max(last, 2), 500),
    }
    ctx: dict[str, Any] = {"nav": "history", "form": form, "kinds": KINDS, "devices": DEVICES,
                           "suites": page_queries.suites_with_results(session),
                           "repos": backend_repositories(session), "history": None, "error": None}
    if fingerprint:
        row = case_store.case_by_fingerprint(session, fingerprint)
        if row is None:
            ctx["error"] = f"No case with fingerprint {fingerprint!r}."
            return page(request, "history.html", 404, **ctx)
        form.update(suite=row.suite, case=fingerprint, device=row.device, world_size=row.world_size)
    if not form["suite"]:
        return page(request, "history.html", **ctx)
    keep = SeriesFilter(case=form["case"] or None, metric=form["metric"] or None,
                        backend=form["backend"] or None, kind=form["kind"] or None)
    try:
        found = repository_history(
            session, form["suite"], backend_repo=backend_repo or None, tip=tip, last=form["last"],
            device=form["device"] or None, world_size=form["world_size"] or None,
            setting=setting or None, keep=keep)
    except (RangeError, InvalidCommitRef) as exc:
        ctx["error"] = str(exc)
        return page(request, "history.html", 422, **ctx)
    query = {k: v for k, v in form.items() if v and k not in ("case", "metric")}
    ctx.update(history=found, commits=history_view.commit_rows(found),
               settings=[(s.key, f"{s.preset} · {s.device} × {s.world_size} · {n} commit(s)")
                         for s, n in found.settings])
    if len(found.series) == 1:
        (series,) = found.series
        points = history_view.point_rows(series)
        marks = [charts.SeriesPoint(p["short"][:8], history_view.judged_value(series, sp),
                                    sp.stats.min if sp.stats else None, sp.stats.p90 if sp.stats else None,
                                    p["n"], f"/jobs/{p['jobs'][0]}#case-{series.fingerprint}")
                 for p, sp in zip(points, series.points, strict=True)]
        title = f"{series.case}: {series.metric} across commits"
        ctx.update(series=series, points=points,
                   svg=charts.history_line(marks, unit=series.unit, bound=series.bound, title=title))
    else:
        rows = history_view.series_rows(found, query)
        for r in rows:
            r["spark"] = charts.sparkline(r.pop("values"), title=f"{r['case']} {r['metric']} across commits")
        ctx.update(series=None, rows=rows)
    return page(request, "history.html", **ctx)


@router.get("/history/{suite}")
def history_suite(request: Request, suite: str) -> RedirectResponse:
    """A suite's history: the history page for that suite, with the same query."""
    query = {**request.query_params, "suite": suite}
    return RedirectResponse("/history?" + urlencode(query), status_code=307)
