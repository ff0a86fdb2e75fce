"""`/finds` and `/finds/{id}`: the stored finds, newest first, and one find's range, verdict,
first bad commit and what moved there, its steps (one gate each) and their jobs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import MAX_ID, DbIdQuery, get_session
from service.persistence import finds as find_store
from service.persistence import gates as gate_store
from service.persistence.models import FindRow
from service.presentation.find_report import OUTCOME_WORD, STEP_WORD
from service.presentation.markdown import short_sha
from service.web.deps import error_page, page, require_page_read, when
from service.web.routes.gates import list_filter

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])


def _find_row(f: FindRow) -> dict[str, Any]:
    return {
        "id": f.id, "verdict": f.verdict, "phase": f.phase, "exit_code": f.exit_code, "reason": f.reason,
        "head": f.head, "head_short": short_sha(f.head), "base": f.base, "base_short": short_sha(f.base),
        "first_bad": f.first_bad, "last_good": f.last_good, "backend": f.backend,
        "backend_repo": f.backend_repo, "device": f.device, "world_size": f.world_size,
        "commits": len(f.commits or []), "measured": list(f.measured or []), "created": when(f.created_at),
        "finished": when(f.finished_at),
    }


@router.get("/finds", response_class=HTMLResponse)
def finds_page(
    request: Request, before: DbIdQuery | None = None, head: str | None = None, base: str | None = None,
    backend: str | None = None, verdict: str | None = None, session: Session = Depends(get_session),
) -> HTMLResponse:
    """The finds newest first, narrowed as the gates list is (head: the bad commit)."""
    form, where, error = list_filter(head, base, backend, verdict)
    if error is not None:
        return page(request, "finds.html", 422, nav="finds", finds=[], next_url=None, **form, error=error)
    rows, nxt = find_store.list_finds(session, before_id=before, limit=50, where=where)
    return page(request, "finds.html", nav="finds", finds=[_find_row(f) for f in rows],
                next_url=f"/finds?before={nxt}" if nxt else None, **form, error=None)


@router.get("/finds/{find_id}", response_class=HTMLResponse)
def find_page(request: Request, find_id: int, session: Session = Depends(get_session)) -> HTMLResponse:
    row = find_store.get_find(session, find_id) if 1 <= find_id <= MAX_ID else None
    if row is None:
        return error_page(request, 404, "No such find", f"There is no find {find_id} in the store.")
    steps = find_store.step_gates(session, [row.id]).get(row.id, [])
    links = gate_store.jobs_of_gates(session, [st.gate_id for st, _ in steps])
    step_rows, jobs = [], []
    for st, gate in steps:
        step_rows.append({"position": st.position + 1, "kind": STEP_WORD.get(st.kind, st.kind),
                          "commit": st.commit, "gate": gate.id, "gate_verdict": gate.verdict,
                          "outcome": st.outcome, "reason": st.reason,
                          "outcome_word": OUTCOME_WORD.get(st.outcome, str(st.outcome))})
        jobs += [{"step": st.position + 1, "id": job.id, "role": link.role, "suite": link.suite,
                  "reused": link.reused, "status": job.status, "verdict": job.verdict,
                  "commit": job.code_commit} for link, job in links.get(st.gate_id, [])]
    asked = sorted((row.request.get("gate") or {}).items())
    return page(request, "find.html", nav="finds", find=_find_row(row), steps=step_rows, jobs=jobs,
                findings=list(row.findings or []), request_items=asked)
