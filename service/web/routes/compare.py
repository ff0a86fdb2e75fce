"""`/compare`: two jobs, commits or a named baseline side by side, per case and metric."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import get_session
from service.domain.baselines import compare_jobs
from service.persistence import baselines as baseline_store
from service.persistence import jobs as job_store
from service.persistence import page_queries, queue
from service.persistence.jobs import find_commit_job
from service.persistence.records import JobRecord
from service.presentation import views
from service.web.deps import (
    DEVICES,
    page,
    require_page_read,
    suite_names,
)

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])


def _resolve_side(session: Session, text: str, suite: str | None, device: str | None,
                  other: JobRecord | None) -> JobRecord:
    """A job id ('12' or '#12'), a named baseline, or a commit (a prefix of 7 or more): that
    commit's job (`find_commit_job`, the API's and the gate's rule) of the suite, matching the
    other side's preset, world size and overrides when the other side is known."""
    t = text.strip().lstrip("#")
    if t.isdigit() and len(t) < 7:
        job = job_store.job_record(session, int(t))
        if job is None:
            raise LookupError(f"there is no job #{t}")
        return job
    named = baseline_store.get_baseline(session, t)
    if named is not None:
        if named.job_id is not None:
            job = job_store.job_record(session, named.job_id)
            if job is None:
                raise LookupError(f"baseline {t!r} points at job #{named.job_id}, which is gone")
            return job
        if named.commit is None:
            raise LookupError(f"baseline {t!r} points at nothing")
        t = named.commit
    suite = suite or (other.suite if other else None)
    if not suite:
        raise LookupError(f"{text!r} looks like a commit: pick a suite (or give a job id on the other side)")
    device = device or (other.device if other else None)
    job = find_commit_job(
        session, t, suite, device=device or None, preset=other.preset if other else None,
        world_size=other.world_size if other else None, params=other.params if other else None,
    )  # the other side's world size and overrides: only a job that measured the same thing
    if job is None:
        raise LookupError(f"no succeeded {suite} job at commit {t!r}" + (f" on {device}" if device else ""))
    return job


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, base: str | None = None, head: str | None = None,
                 suite: str | None = None, device: str | None = None, show: str = "changes",
                 session: Session = Depends(get_session)) -> HTMLResponse:
    recent = [{"id": j.id, "suite": j.suite, "preset": j.preset, "commit": j.code_commit, "device": j.device}
              for j in job_store.list_jobs(session, status="succeeded", limit=30)[0]]
    baselines = [b.name for b in baseline_store.list_baselines(session)]
    show = show if show in views.COMPARE_VIEWS else "changes"
    form = {"base": base, "head": head, "suite": suite, "device": device, "show": show}
    ctx: dict[str, Any] = {"nav": "compare", "form": form, "recent": recent, "devices": DEVICES,
                           "suites": sorted(set(suite_names())
                                            | set(page_queries.suites_with_results(session))),
                           "cmp": None, "error": None, "views_available": list(views.COMPARE_VIEWS.items()),
                           "baselines": baselines}
    if not base or not head:
        return page(request, "compare.html", **ctx)
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
        return page(request, "compare.html", 404, **ctx)
    try:
        cmp = _compare(session, base_job.id, head_job.id)
    except ValueError as exc:  # the engine refuses these inputs: say why instead of a bare 500
        ctx["error"] = f"Could not compare job #{base_job.id} with job #{head_job.id}: {exc}"
        return page(request, "compare.html", 422, **ctx)
    q = {k: v for k, v in form.items() if v and k != "show"}
    ctx.update(
        cmp=cmp, rows=views.compare_rows(cmp, show, _history_query(head_job)),
        counts=list(cmp.counts().items()), verdict=views.compare_verdict(cmp),
        metric_counts=list(cmp.metric_counts().items()),
        view_links=[(key, label, "/compare?" + urlencode({**q, "show": key}))
                    for key, label in views.COMPARE_VIEWS.items()],
    )
    return page(request, "compare.html", **ctx)


def _history_query(job: JobRecord) -> str:
    """What a case's history link adds for a job of a backend's repository: that repository."""
    repo = queue.job_backend_repo(job)
    return "&" + urlencode({"backend_repo": repo}) if repo else ""


def _compare(session: Session, base_id: int, head_id: int) -> Any:
    """The compare engine over two stored jobs (the loader turns jobs into sides)."""
    return compare_jobs(session, base_id, head_id)
