"""`POST /api/v1/gate`: one step of the gate (`service.domain.gate.evaluate_gate`): finds or
submits the jobs and answers the state; call again with the same body (same `run_id`) until
`phase` is `done`. Writes jobs, so it needs the bearer token when one is configured.
`GET /api/v1/gates` and `/api/v1/gates/{id}`: the stored gates, each with its request, jobs,
rounds, confirmation pairs, verdict and the reason per changed metric."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

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
from service.api.schemas import Page
from service.domain.gate import (
    EXIT_INFRA,
    GateInputError,
    GateRequest,
    GateState,
    default_submit,
    evaluate_gate,
)
from service.domain.gate.decision import stored_finding
from service.persistence import gates as gate_store
from service.persistence.models import GateJobRow, GateRow, JobRow
from service.presentation.gate_report import gate_answer

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["gate"])


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


@router.post("/gate", dependencies=[Depends(require_write)])
def gate_step(
    body: GateRequest, request: Request, engine: EngineDep, settings: SettingsDep, runner: RunnerDep
) -> dict[str, Any]:
    """Advance the gate; `exit_code` is set once `phase` is `done` (0 pass, 1 fail, 2 could not run)."""
    if runner.executor is None:
        why = f"could not run: the service has no executor ({runner.error})"
        refused = GateState("done", EXIT_INFRA, "error", why, body.head, None, "")
        return gate_answer(refused, _base_url(request))
    submit = default_submit(engine, settings, runner.executor, runner.wake)
    try:
        result = evaluate_gate(engine, body, submit)
    except GateInputError as exc:
        raise HTTPException(422, str(exc)) from exc
    return gate_answer(result, _base_url(request))


class GateJobOut(BaseModel):
    job_id: int
    role: str = Field(description="head, base, round-base/round-head (re-measurements), confirm-base/confirm")
    suite: str
    reused: bool = Field(description="an existing job of the commit, not submitted by this gate")
    status: str
    verdict: str | None
    code_commit: str | None = Field(description="the commit of the code under test (a backend's or ours)")

    @classmethod
    def of(cls, link: GateJobRow, job: JobRow) -> GateJobOut:
        return cls(job_id=link.job_id, role=link.role, suite=link.suite, reused=link.reused,
                   status=job.status, verdict=job.verdict, code_commit=job.code_commit)


class GateOut(BaseModel):
    id: int
    run_id: str
    head: str
    base: str | None
    base_source: str
    backend: str | None
    backend_repo: str | None
    device: str
    world_size: int
    phase: str = Field(description="waiting (jobs pending) or done")
    verdict: str | None = Field(description="pass, fail or error (could not decide or run); null: waiting")
    exit_code: int | None
    reason: str
    rounds: int = Field(description="re-measurement rounds run (of the first pairs and confirmation pairs)")
    confirmations: list[dict[str, Any]] = Field(
        description="time regressions re-measured by a fresh pair, each with its outcome: confirmed, "
        "cleared or undecided (an undecided one makes the gate exit 2)"
    )
    findings: list[dict[str, Any]] = Field(
        description="each judged metric that moved, per case: verdict, change (regression, undecided, "
        "improvement, recorded), summary, reason and the jobs each side pooled; regressions first"
    )
    undecided: list[str]
    request: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    jobs: list[GateJobOut] = Field(description="in the gate's order")

    @classmethod
    def of(cls, gate: GateRow, links: list[tuple[GateJobRow, JobRow]]) -> GateOut:
        jobs = [GateJobOut.of(link, job) for link, job in links]
        return cls(
            id=gate.id, run_id=gate.run_id, head=gate.head, base=gate.base, base_source=gate.base_source,
            backend=gate.backend, backend_repo=gate.backend_repo, device=gate.device,
            world_size=gate.world_size, phase=gate.phase, verdict=gate.verdict, exit_code=gate.exit_code,
            reason=gate.reason, rounds=gate.rounds, confirmations=list(gate.confirmations or []),
            findings=[stored_finding(f) for f in gate.findings or []], undecided=list(gate.undecided or []),
            request=dict(gate.request or {}), created_at=gate.created_at, updated_at=gate.updated_at,
            finished_at=gate.finished_at, jobs=jobs,
        )


ShaQuery = Annotated[str | None, Query(min_length=4, max_length=64, pattern="^[0-9a-fA-F]+$",
                                       description="a full sha or a prefix of one")]


def gate_filter(
    head: ShaQuery = None,
    base: ShaQuery = None,
    backend: Annotated[str | None, Query(max_length=200, description="the backend under test's name")] = None,
    verdict: Annotated[Literal["pass", "fail", "error", "waiting"] | None,
                       Query(description="waiting: no verdict yet")] = None,
) -> gate_store.GateFilter:
    """The filters of the gates' (and finds') lists, as query parameters."""
    return gate_store.GateFilter(head=head and head.lower(), base=base and base.lower(), backend=backend,
                                 verdict=verdict)


ListFilter = Annotated[gate_store.GateFilter, Depends(gate_filter)]


@router.get("/gates", response_model=Page[GateOut])
def list_gates(
    session: SessionDep, where: ListFilter, limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> Page[GateOut]:
    """Newest first, each with its jobs; pass `next` back as `cursor` for the following page."""
    gates, nxt = gate_store.list_gates(session, before_id=cursor_value(cursor), limit=limit, where=where)
    links = gate_store.jobs_of_gates(session, [g.id for g in gates])
    return Page[GateOut](items=[GateOut.of(g, links.get(g.id, [])) for g in gates],
                         next=None if nxt is None else str(nxt))


@router.get("/gates/{gate_id}", response_model=GateOut)
def get_gate(gate_id: DbId, session: SessionDep) -> GateOut:
    gate = gate_store.get_gate(session, gate_id)
    if gate is None:
        raise HTTPException(404, f"no gate {gate_id} in the store")
    return GateOut.of(gate, gate_store.gate_job_rows(session, gate.id))
