"""`POST /api/v1/find`: one step of a find (`service.domain.find.evaluate_find`): gates what the
bisection needs now and answers the state; call again with the same body (same `run_id`) until
`phase` is `done`. Writes jobs, so it needs the bearer token when one is configured.
`GET /api/v1/finds` and `/api/v1/finds/{id}`: the stored finds, each with its steps (one gate
each) and the jobs those gates ran or reused; filters as the gates' (head: the bad commit, base:
the good one)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, Field

from service.api.deps import (
    Cursor,
    DbId,
    EngineDep,
    RunnerDep,
    SessionDep,
    SettingsDep,
    cursor_value,
    require_read,
    require_write,
)
from service.api.routes.gate import GateJobOut, ListFilter
from service.api.schemas import Page
from service.domain.find import FindInputError, FindRequest, FindState, evaluate_find
from service.domain.gate import EXIT_INFRA, default_submit
from service.persistence import finds as find_store
from service.persistence import gates as gate_store
from service.persistence.models import FindRow
from service.presentation.find_report import find_answer

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["gate"])


@router.post("/find", dependencies=[Depends(require_write)])
def find_step(
    body: FindRequest, request: Request, engine: EngineDep, settings: SettingsDep, runner: RunnerDep
) -> dict[str, Any]:
    """Advance the find; `exit_code` is set once `phase` is `done` (1 first bad commit found, 0 no
    regression, 2 could not decide)."""
    base_url = str(request.base_url).rstrip("/")
    if runner.executor is None:
        refused = FindState("done", EXIT_INFRA, "error", f"could not run: the service has no executor "
                            f"({runner.error})", str(body.gate.base), body.gate.head, list(body.commits))
        return find_answer(refused, base_url)
    submit = default_submit(engine, settings, runner.executor, runner.wake)
    try:
        return find_answer(evaluate_find(engine, body, submit), base_url)
    except FindInputError as exc:
        raise HTTPException(422, str(exc)) from exc


class FindStepOut(BaseModel):
    position: int
    kind: str = Field(description="verify (the bad end), bisect, or confirm (the boundary measured anew)")
    commit: str
    gate_id: int
    gate_verdict: str | None
    outcome: str | None = Field(description="good, bad or skip (could not run or decide); null: running")
    reason: str
    jobs: list[GateJobOut]


class FindOut(BaseModel):
    id: int
    run_id: str
    head: str = Field(description="the bad commit")
    base: str = Field(description="the good commit")
    backend: str | None
    backend_repo: str | None
    device: str
    world_size: int
    commits: list[str] = Field(description="the range after base up to head, oldest first, first parents")
    phase: str
    verdict: str | None = Field(description="fail: a first bad commit found; pass: no regression; error")
    exit_code: int | None
    reason: str
    first_bad: str | None
    last_good: str | None
    findings: list[dict[str, Any]] = Field(description="what moved at the boundary, per metric")
    measured: list[str] = Field(description="the commits whose jobs the find ran (not reused)")
    request: dict[str, Any]
    steps: list[FindStepOut]
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, row: FindRow, steps: list[Any], jobs: dict[int, list[Any]]) -> FindOut:
        return cls(
            id=row.id, run_id=row.run_id, head=row.head, base=row.base, backend=row.backend,
            backend_repo=row.backend_repo, device=row.device, world_size=row.world_size,
            commits=list(row.commits or []), phase=row.phase, verdict=row.verdict, exit_code=row.exit_code,
            reason=row.reason, first_bad=row.first_bad, last_good=row.last_good,
            findings=list(row.findings or []), measured=list(row.measured or []),
            request=dict(row.request or {}),
            steps=[FindStepOut(position=st.position, kind=st.kind, commit=st.commit, gate_id=st.gate_id,
                               gate_verdict=gate.verdict, outcome=st.outcome, reason=st.reason,
                               jobs=[GateJobOut.of(link, job) for link, job in jobs.get(st.gate_id, [])])
                   for st, gate in steps],
            created_at=row.created_at, updated_at=row.updated_at, finished_at=row.finished_at,
        )


def _outs(session: Any, rows: list[FindRow]) -> list[FindOut]:
    steps = find_store.step_gates(session, [r.id for r in rows])
    gate_ids = [st.gate_id for r in rows for st, _ in steps.get(r.id, [])]
    jobs = gate_store.jobs_of_gates(session, gate_ids)
    return [FindOut.of(r, steps.get(r.id, []), jobs) for r in rows]


@router.get("/finds", response_model=Page[FindOut])
def list_finds(
    session: SessionDep, where: ListFilter, limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> Page[FindOut]:
    """Newest first, each with its steps and their jobs (head: the bad commit, base: the good
    one, verdict fail: a first bad commit found); pass `next` back as `cursor`."""
    rows, nxt = find_store.list_finds(session, before_id=cursor_value(cursor), limit=limit, where=where)
    return Page[FindOut](items=_outs(session, rows), next=None if nxt is None else str(nxt))


@router.get("/finds/{find_id}", response_model=FindOut)
def get_find(find_id: DbId, session: SessionDep) -> FindOut:
    row = find_store.get_find(session, find_id)
    if row is None:
        raise HTTPException(404, f"no find {find_id} in the store")
    return _outs(session, [row])[0]
