"""`/reports/campaign?job=N&job=M...`: the report of stored jobs as a page: the blocks of the
Markdown report (`service.presentation.report_build`, the same `Report`) drawn as HTML, and its
plots, one per quantity with the modes overlaid."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import MAX_ID, get_session
from service.domain.baselines import NotFound
from service.presentation.campaign_report import campaign_report
from service.presentation.report_model import Block, Links, Plot, StepPlot, Table
from service.web import charts
from service.web.deps import error_page, page, require_page_read

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])
MAX_JOBS = 40


def _blocks(blocks: list[Block]) -> list[dict[str, Any]]:
    """Paragraphs, lists and tables (each part of a split table its own) for the template."""
    out: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, Table):
            out += [{"kind": "table", "header": p.header, "rows": p.rows, "keys": p.keys} for p in b.parts()]
        elif b.startswith("- "):
            if out and out[-1]["kind"] == "list":
                out[-1]["items"].append(b[2:])
            else:
                out.append({"kind": "list", "items": [b[2:]]})
        else:
            out.append({"kind": "text", "text": b})
    return out


def _plot(p: Plot) -> dict[str, Any]:
    if isinstance(p, StepPlot):
        series = [charts.Trajectory(s.name, s.steps, s.values, bound=s.bound) for s in p.series]
        return {
            "key": p.key,
            "caption": p.title,
            "svg": charts.trajectory_chart(series, title=p.title, unit=p.unit),
        }
    series = [charts.SweepSeries(s.name, s.sizes, s.values, s.lo, s.hi) for s in p.series]
    return {
        "key": p.key,
        "caption": p.title,
        "svg": charts.sweep_chart(series, title=p.title, x_label=p.x_label, unit=p.unit),
    }


@router.get("/reports/campaign", response_class=HTMLResponse)
def campaign_page(
    request: Request,
    session: Annotated[Session, Depends(get_session)],
    job: Annotated[list[Annotated[int, Query(ge=1, le=MAX_ID)]] | None, Query(max_length=MAX_JOBS)] = None,
) -> HTMLResponse:
    """The report of the jobs named by `job` (repeatable), in the Markdown report's order; its
    links are this service's own pages, relative to where the page is read."""
    if not job:
        return error_page(request, 422, "No jobs", "name the campaign's jobs: /reports/campaign?job=1&job=2")
    try:
        report = campaign_report(session, job, links=Links(""))
    except NotFound as exc:
        return error_page(request, 404, "Unknown job", str(exc))
    return page(
        request,
        "report.html",
        nav="jobs",
        job_ids=list(dict.fromkeys(job)),
        notes=report.notes,
        plots=[_plot(p) for p in report.plots],
        sections=[{"key": s.key, "title": s.title, "blocks": _blocks(s.blocks)} for s in report.sections],
    )
