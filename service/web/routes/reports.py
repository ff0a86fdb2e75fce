"""`/reports/campaign?job=N&job=M...`: the campaign report of stored jobs as a page, its tables
(`service.presentation.campaign_sections`, the Markdown report's plain data) and its plots."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import MAX_ID, get_session
from service.domain.baselines import NotFound
from service.presentation.campaign_report import load_jobs
from service.presentation.campaign_sections import Links, Table, build_sections, sweeps
from service.web import charts
from service.web.deps import error_page, page, require_page_read

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])
_LINK = re.compile(r"^\[(?P<text>[^\]]*)\]\((?P<href>[^)]*)\)$")
MAX_JOBS = 40


def _cell(text: str) -> dict[str, str | None]:
    """A table cell as text and the href of its link, if the whole cell is one."""
    found = _LINK.match(text)
    if found is None:
        return {"text": text.replace("\\|", "|"), "href": None}
    return {"text": found["text"].replace("\\|", "|"), "href": found["href"]}


def _blocks(blocks: list[str | Table]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, Table):
            out.append({"kind": "table", "header": b.header, "rows": [[_cell(c) for c in r] for r in b.rows]})
        elif b.startswith("- "):
            if out and out[-1]["kind"] == "list":
                out[-1]["items"].append(b[2:])
            else:
                out.append({"kind": "list", "items": [b[2:]]})
        else:
            out.append({"kind": "text", "text": b})
    return out


@router.get("/reports/campaign", response_class=HTMLResponse)
def campaign_page(
    request: Request,
    session: Annotated[Session, Depends(get_session)],
    job: Annotated[list[Annotated[int, Query(ge=1, le=MAX_ID)]] | None, Query(max_length=MAX_JOBS)] = None,
) -> HTMLResponse:
    """The report of the jobs named by `job` (repeatable), in the Markdown report's order."""
    if not job:
        return error_page(request, 422, "No jobs", "name the campaign's jobs: /reports/campaign?job=1&job=2")
    try:
        jobs = load_jobs(session, job)
    except NotFound as exc:
        return error_page(request, 404, "Unknown job", str(exc))
    # the page links to this service's own pages, at the URL the page was asked for
    sections = build_sections(jobs, (), Links(str(request.base_url).rstrip("/")))
    plots = []
    for s in sweeps(jobs):
        series = [charts.SweepSeries(x.name, x.sizes, x.values, x.lo, x.hi) for x in s.series]
        svg = charts.sweep_chart(series, title=s.title, x_label=s.x_label, unit=s.unit)
        plots.append({"key": s.key, "caption": s.title, "svg": svg})
    return page(
        request,
        "report.html",
        nav="jobs",
        job_ids=list(dict.fromkeys(job)),
        plots=plots,
        sections=[{"key": s.key, "title": s.title, "blocks": _blocks(s.blocks)} for s in sections],
    )
