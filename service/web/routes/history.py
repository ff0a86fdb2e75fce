"""`/history`: one series across commits; `/history/{suite}`: a suite's sparklines."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import DbIntQuery, get_session
from service.persistence import cases as case_store
from service.persistence import page_queries
from service.persistence import samples as sample_store
from service.persistence.models import JobRow
from service.presentation import views
from service.presentation.numbers import fmt
from service.web import charts
from service.web.deps import (
    DEVICES,
    page,
    require_page_read,
    when,
)
from workers import verdict
from workers.stats import summarise

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])


@router.get("/history", response_class=HTMLResponse)
def history_page(request: Request, fingerprint: str | None = None, metric: str | None = None,
                 session: Session = Depends(get_session)) -> HTMLResponse:
    suites = page_queries.suites_with_results(session)
    if not fingerprint:
        return page(request, "history.html", nav="history", series=None, missing=None, suites=suites)
    case = case_store.case_by_fingerprint(session, fingerprint)
    if case is None:
        return page(request, "history.html", 404, nav="history", series=None, suites=suites,
                     missing=f"No case with fingerprint {fingerprint!r}.")
    names = page_queries.case_metric_names(session, fingerprint)
    if not names:
        return page(request, "history.html", 404, nav="history", series=None, suites=suites,
                     missing=f"Case {case.name!r} has no samples yet.")
    metric = metric if metric in names else names[0]
    mdef = sample_store.metric_by_name(session, case.suite, metric)
    unit = mdef.unit if mdef else ""
    stats = page_queries.series_summaries(session, case.id, mdef.id) if mdef else []
    if not stats:  # jobs stored without summaries (not run by the service): reduce the raw samples
        raw = sample_store.fingerprint_series(session, fingerprint, metric)
        stats = [_raw_stat(job, worst.values, mdef.direction if mdef else "lower") for job, worst in raw]
    points: list[charts.SeriesPoint] = []
    rows: list[dict[str, Any]] = []
    prev: float | None = None
    for row in stats:
        job, st = row.job, row.stats
        ok = st.count > 0 and st.median == st.median
        med, lo, p90, hi = (st.median, st.min, st.p90, st.max) if ok else (None, None, None, None)
        label = (job.code_commit or f"#{job.id}")[:8]
        href = f"/jobs/{job.id}#case-{fingerprint}"
        points.append(charts.SeriesPoint(label, med, lo, p90, st.count, href))
        change = views.Cell("–")
        if med is not None and prev not in (None, 0.0):
            r = med / prev - 1
            worse = r > 0.05 if (mdef is None or mdef.direction == "lower") else r < -0.05
            better = r < -0.05 if (mdef is None or mdef.direction == "lower") else r > 0.05
            change = views.Cell(f"{r:+.1%}", "bad" if worse else ("ok" if better else "none"),
                                "worse" if worse else ("better" if better else ""))
        rows.append({"job": job.id, "commit": label, "finished": when(job.finished_at),
                     "median": fmt(med, unit), "min": fmt(lo), "p90": fmt(p90), "max": fmt(hi),
                     "n": st.count, "change": change})
        prev = med if med is not None else prev
    svg = charts.history_line(points, unit=unit, bound=mdef.bound if mdef else None,
                              title=f"{case.name}: {metric} across commits")
    series = {"case": case.name, "suite": case.suite, "device": case.device, "world_size": case.world_size,
              "fingerprint": fingerprint, "metric": metric, "metrics": names, "points": points, "rows": rows,
              "svg": svg, "spread": "min to p90"}
    return page(request, "history.html", nav="history", series=series, missing=None, suites=suites)


def _raw_stat(job: JobRow, values: Any, direction: str) -> page_queries.SeriesStat:
    return page_queries.SeriesStat(job, summarise(values, direction))


@router.get("/history/{suite}", response_class=HTMLResponse)
def history_suite(request: Request, suite: str, kind: str = "time", device: str | None = None,
                  world_size: DbIntQuery | None = None, last: int = 20,
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
            "world_size": s.world_size, "n": len(meds), "latest": fmt(meds[-1] if meds else None, s.unit),
            "change": change,
            "spark": charts.sparkline(meds, title=f"{s.case} {s.metric} over the last {len(meds)} jobs",
                                      unit=s.unit),
        })
    return page(request, "history_suite.html", nav="history", suite=suite, kind=kind, kinds=kinds,
                 device=device, devices=DEVICES, world_size=world_size, last=last, rows=rows)
