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
from service.persistence import jobs as job_store
from service.persistence import page_queries
from service.persistence import samples as sample_store
from service.presentation.campaign_report import load_jobs
from service.presentation.campaign_sections import CampaignJob, Links, Table, build_sections, sweeps
from service.web import charts
from service.web.deps import error_page, page, require_page_read

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])
_LINK = re.compile(r"^\[(?P<text>[^\]]*)\]\((?P<href>[^)]*)\)$")
MAX_JOBS = 40
MAX_TRAJECTORY_CASES = 12  # trajectory plots per page (each case: loss and grad-norm)
TRAJECTORY_PAIRS = (("loss", "ref_loss", "cand_loss"), ("grad-norm", "ref_grad_norm", "cand_grad_norm"))


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


def _trajectory_plots(session: Session, jobs: list[CampaignJob]) -> list[dict[str, Any]]:
    """Loss and grad-norm against step, reference and candidate overlaid, per network trajectory
    case (the worst rank of each step; over MAX_STEPS steps the worst of each bin)."""
    out: list[dict[str, Any]] = []
    for j in jobs:
        d = j.data
        cases = [c for c in d.cases if d.suite == "network" and (c.params or {}).get("kind") == "trajectory"]
        if not cases or len(out) >= 2 * MAX_TRAJECTORY_CASES:
            continue
        defs = {m.name: m for m in sample_store.metrics_of_kinds(session, d.suite, ("trajectory",))}
        wanted = {
            defs[n].id: (n, defs[n].direction) for _, *names in TRAJECTORY_PAIRS for n in names if n in defs
        }
        bins: dict[int, int] = {}
        for c in cases:
            for n, ms in c.metrics.items():
                if n in defs and defs[n].id in wanted and ms.count > charts.MAX_STEPS:
                    bins[defs[n].id] = max(bins.get(defs[n].id, 1), -(-ms.count // charts.MAX_STEPS))
        row = job_store.get_job(session, d.job_id)
        attempt = max(1, row.attempts if row is not None else 1)
        case_ids = [c.case_id for c in cases][:MAX_TRAJECTORY_CASES]
        groups = page_queries.step_groups(session, d.job_id, attempt, case_ids, wanted, bins)
        by = {(g.case_id, g.metric): g for g in groups}
        for c in cases[:MAX_TRAJECTORY_CASES]:
            for what, ref, cand in TRAJECTORY_PAIRS:
                series = [
                    # the reference wide, under the candidate: where they agree both stay visible
                    charts.Trajectory(side, g.idx, g.worst, per_bin=bins.get(defs[name].id, 1),
                                      width=4.0 if side == "reference" else 1.5)
                    for side, name in (("reference", ref), ("candidate", cand))
                    if (g := by.get((c.case_id, name))) is not None
                ]
                if series:
                    title = f"CP{d.world_size} {c.name}: {what} per step"
                    out.append({"key": "trajectory", "caption": title,
                                "svg": charts.trajectory_chart(series, title=title)})
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
    plots += _trajectory_plots(session, jobs)
    return page(
        request,
        "report.html",
        nav="jobs",
        job_ids=list(dict.fromkeys(job)),
        plots=plots,
        sections=[{"key": s.key, "title": s.title, "blocks": _blocks(s.blocks)} for s in sections],
    )
