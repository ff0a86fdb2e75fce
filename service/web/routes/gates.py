"""`/gates` and `/gates/{id}`: the stored gates, newest first, and one gate's request, jobs,
rounds, confirmation pairs, verdict and the reason per changed metric."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import MAX_ID, DbIdQuery, get_session
from service.domain.gate.decision import stored_finding
from service.persistence import gates as gate_store
from service.persistence import page_queries
from service.persistence.models import GateRow
from service.presentation import views
from service.presentation.gate_report import counted_word
from service.presentation.markdown import short_sha
from service.web.deps import error_page, page, require_page_read, when

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])
_HEX = re.compile(r"[0-9a-f]{1,64}")


def _gate_row(g: GateRow) -> dict[str, Any]:
    return {
        "id": g.id, "verdict": g.verdict, "phase": g.phase, "exit_code": g.exit_code, "reason": g.reason,
        "head": g.head, "head_short": short_sha(g.head), "base": g.base, "base_short": short_sha(g.base),
        "backend": g.backend, "backend_repo": g.backend_repo, "device": g.device, "world_size": g.world_size,
        "rounds": g.rounds, "created": when(g.created_at), "finished": when(g.finished_at),
        "duration": views.duration(g.created_at, g.finished_at, None) if g.finished_at else "–",
    }


GATE_VERDICTS = ("pass", "fail", "error", "waiting")


def list_filter(
    head: str | None, base: str | None, backend: str | None, verdict: str | None
) -> tuple[dict[str, Any], gate_store.GateFilter, str | None]:
    """A list page's filters (the gates', the finds'): the form as typed, the filter, and why
    it is refused (a head or base that is no hex prefix, an unknown verdict), else None."""
    form = {"head": (head or "").strip().lower(), "base": (base or "").strip().lower(),
            "backend": (backend or "").strip(), "verdict": verdict or ""}
    bad = [f"{k} {form[k]!r} is not a hex sha prefix" for k in ("head", "base")
           if form[k] and not _HEX.fullmatch(form[k])]
    if form["verdict"] and form["verdict"] not in GATE_VERDICTS:
        bad.append(f"verdict {form['verdict']!r} is not one of {', '.join(GATE_VERDICTS)}")
    where = gate_store.GateFilter(**{k: v or None for k, v in form.items()})
    return {"form": form, "verdicts": GATE_VERDICTS}, where, "; ".join(bad) or None


@router.get("/gates", response_class=HTMLResponse)
def gates_page(
    request: Request, before: DbIdQuery | None = None, head: str | None = None, base: str | None = None,
    backend: str | None = None, verdict: str | None = None, session: Session = Depends(get_session),
) -> HTMLResponse:
    """The gates newest first, narrowed by head, base (sha prefixes), backend and verdict."""
    form, where, error = list_filter(head, base, backend, verdict)
    if error is not None:
        return page(request, "gates.html", 422, nav="gates", gates=[], next_url=None, **form, error=error)
    gates, nxt = gate_store.list_gates(session, before_id=before, limit=50, where=where)
    more = urlencode({"before": nxt, **{k: v for k, v in form["form"].items() if v}}) if nxt else None
    return page(request, "gates.html", nav="gates", gates=[_gate_row(g) for g in gates],
                next_url=f"/gates?{more}" if more else None, **form, error=None)


@router.get("/gates/{gate_id}", response_class=HTMLResponse)
def gate_page(request: Request, gate_id: int, session: Session = Depends(get_session)) -> HTMLResponse:
    gate = gate_store.get_gate(session, gate_id) if 1 <= gate_id <= MAX_ID else None
    if gate is None:
        return error_page(request, 404, "No such gate", f"There is no gate {gate_id} in the store.")
    links = gate_store.gate_job_rows(session, gate.id)
    counts = page_queries.job_case_counts(session, [job.id for _, job in links])
    jobs = []
    for link, job in links:
        word, css = views.job_verdict(job.status, job.verdict, counts.get(job.id, {}))
        jobs.append({"id": job.id, "role": link.role, "suite": link.suite, "reused": link.reused,
                     "status": job.status, "verdict": word, "verdict_class": css,
                     "commit": job.code_commit})
    return page(request, "gate.html", nav="gates", gate=_gate_row(gate), jobs=jobs,
                findings=[stored_finding(f) for f in gate.findings or []],
                confirmations=[{**c, "counted": counted_word(c)} for c in gate.confirmations or []],
                undecided=list(gate.undecided or []),
                request_items=sorted((gate.request or {}).items()))
