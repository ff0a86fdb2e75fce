"""Find rows: each find run's request, range, state and verdict, its steps (one gate each), and
which finds a job belongs to (through its steps' gates: a job page links them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from service.persistence.db import write_tx
from service.persistence.gates import GateFilter, upsert_run
from service.persistence.models import FindRow, FindStepRow, GateJobRow, GateRow

FIND_FIELDS = ("head", "base", "backend", "backend_repo", "device", "world_size", "commits", "phase",
               "verdict", "exit_code", "reason", "first_bad", "last_good", "findings", "measured")


@dataclass(frozen=True)
class FindStep:
    """One step as the find records it: the gate of `commit` and what it made of it."""

    position: int
    kind: str
    commit: str
    gate_id: int
    outcome: str | None
    reason: str


def save_find(
    engine: Engine, run_id: str, request: Mapping[str, Any], fields: Mapping[str, Any],
    steps: Iterable[FindStep],
) -> int:
    """Create or update the find `run_id` with `fields` (of FIND_FIELDS) and its steps (a step
    already recorded at a position is updated); the finish time is set when it is done."""
    with write_tx(engine) as s:
        row = upsert_run(s, FindRow, FIND_FIELDS, run_id, request, fields)
        have = {st.position: st for st in s.scalars(select(FindStepRow).where(FindStepRow.find_id == row.id))}
        for step in steps:
            known = have.get(step.position)
            if known is None:
                s.add(FindStepRow(find_id=row.id, position=step.position, kind=step.kind, commit=step.commit,
                                  gate_id=step.gate_id, outcome=step.outcome, reason=step.reason))
            else:
                known.outcome, known.reason = step.outcome, step.reason
        return int(row.id)


def _step(r: FindStepRow) -> FindStep:
    return FindStep(r.position, r.kind, r.commit, r.gate_id, r.outcome, r.reason)


def find_steps(session: Session, find_id: int) -> list[FindStep]:
    q = select(FindStepRow).where(FindStepRow.find_id == find_id).order_by(FindStepRow.position)
    return [_step(r) for r in session.scalars(q)]


def steps_of_run(session: Session, run_id: str) -> list[FindStep]:
    """The steps recorded so far by the find `run_id` (none before its first step)."""
    row = session.scalars(select(FindRow).where(FindRow.run_id == run_id)).first()
    return [] if row is None else find_steps(session, row.id)


def get_find(session: Session, find_id: int) -> FindRow | None:
    return session.get(FindRow, find_id)


def list_finds(
    session: Session, *, before_id: int | None = None, limit: int = 50, where: GateFilter | None = None
) -> tuple[list[FindRow], int | None]:
    """Newest first, those `where` keeps (head: the bad commit, base: the good one); the page
    and the cursor (an id) of the next page, or None."""
    q = select(FindRow).order_by(FindRow.id.desc()).limit(limit + 1)
    if before_id is not None:
        q = q.where(FindRow.id < before_id)
    if where is not None:
        q = where.where(q, FindRow)
    rows = list(session.scalars(q))
    nxt = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], nxt


def step_gates(session: Session, find_ids: Sequence[int]) -> dict[int, list[tuple[FindStep, GateRow]]]:
    """Per find id, its steps with their gates, in order (one query for a page of finds)."""
    if not find_ids:
        return {}
    q = (select(FindStepRow, GateRow).join(GateRow, GateRow.id == FindStepRow.gate_id)
         .where(FindStepRow.find_id.in_(list(find_ids))).order_by(FindStepRow.position))
    out: dict[int, list[tuple[FindStep, GateRow]]] = {}
    for r, gate in session.execute(q):
        out.setdefault(r.find_id, []).append((_step(r), gate))
    return out


def finds_of_jobs(session: Session, job_ids: Sequence[int]) -> dict[int, list[FindRow]]:
    """Per job id, the finds one of whose steps ran or reused it, newest first."""
    if not job_ids:
        return {}
    q = (select(GateJobRow.job_id, FindRow)
         .join(FindStepRow, FindStepRow.gate_id == GateJobRow.gate_id)
         .join(FindRow, FindRow.id == FindStepRow.find_id)
         .where(GateJobRow.job_id.in_(list(job_ids)))
         .order_by(FindRow.id.desc()))
    out: dict[int, list[FindRow]] = {}
    for job_id, find in session.execute(q):
        finds = out.setdefault(int(job_id), [])
        if all(f.id != find.id for f in finds):
            finds.append(find)
    return out


def gate_findings(session: Session, gate_id: int) -> list[dict[str, Any]]:
    """The findings a gate stored (what changed, per metric, and why)."""
    gate = session.get(GateRow, gate_id)
    return list(gate.findings or []) if gate is not None else []


def measured_commits(session: Session, gate_ids: Sequence[int]) -> list[str]:
    """The commits whose jobs these gates ran themselves (not reused ones), in the gates' order."""
    from service.persistence.gates import jobs_of_gates

    links = jobs_of_gates(session, gate_ids)
    out: list[str] = []
    for gate_id in gate_ids:
        for link, job in links.get(gate_id, []):
            if not link.reused and job.code_commit and job.code_commit not in out:
                out.append(job.code_commit)
    return out
