"""Gate rows: each gate run's request, state and verdict, the jobs it ran, and which gates a job
belongs to (the job list shows their verdicts, a job page links them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Select, select
from sqlalchemy.orm import Session

from service.persistence.db import write_tx
from service.persistence.models import GateJobRow, GateRow, JobRow, utcnow

GATE_FIELDS = ("head", "base", "base_source", "backend", "backend_repo", "device", "world_size",
               "phase", "verdict", "exit_code", "reason", "rounds", "confirmations", "findings",
               "undecided")


@dataclass(frozen=True)
class GateJobLink:
    """One job of a gate, as the gate recorded it."""

    job_id: int
    role: str
    suite: str
    reused: bool


def save_gate(
    engine: Engine,
    run_id: str,
    request: Mapping[str, Any],
    fields: Mapping[str, Any],
    jobs: Iterable[GateJobLink],
) -> int:
    """Create or update the gate `run_id` with `fields` (of GATE_FIELDS) and add the jobs it does
    not list yet; the finish time is set when its phase becomes `done`. Returns its id."""
    with write_tx(engine) as s:
        row = upsert_run(s, GateRow, GATE_FIELDS, run_id, request, fields)
        have = {(j.job_id, j.role) for j in s.scalars(select(GateJobRow).where(GateJobRow.gate_id == row.id))}
        for j in jobs:
            if (j.job_id, j.role) not in have:
                have.add((j.job_id, j.role))
                s.add(
                    GateJobRow(gate_id=row.id, job_id=j.job_id, role=j.role, suite=j.suite, reused=j.reused)
                )
        return int(row.id)


def upsert_run(
    s: Session, model: Any, allowed: Sequence[str], run_id: str, request: Mapping[str, Any],
    fields: Mapping[str, Any],
) -> Any:
    """The row of run `run_id` of a state machine kept in the store (a gate's, a find's), created
    with its request on first use, with `fields` (of `allowed`) set; its finish time is set
    when its phase becomes `done`."""
    unknown = sorted(set(fields) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {model.__tablename__} field(s) {unknown}; "
                         f"expected some of {list(allowed)}")
    row = s.scalars(select(model).where(model.run_id == run_id)).first()
    if row is None:
        row = model(run_id=run_id, request=dict(request))
        s.add(row)
    for key, value in fields.items():
        setattr(row, key, value)
    row.updated_at = utcnow()
    if row.phase == "done" and row.finished_at is None:
        row.finished_at = row.updated_at
    s.flush()
    return row


def get_gate(session: Session, gate_id: int) -> GateRow | None:
    return session.get(GateRow, gate_id)


def gate_jobs(session: Session, gate_id: int) -> list[GateJobRow]:
    """The gate's jobs in the order it recorded them."""
    return list(
        session.scalars(select(GateJobRow).where(GateJobRow.gate_id == gate_id).order_by(GateJobRow.id))
    )


@dataclass(frozen=True)
class GateFilter:
    """Which gates (or finds) a list shows: `head`/`base` a full sha or a prefix of one,
    `backend` the gated backend's name, `verdict` pass, fail, error, or waiting (no verdict yet)."""

    head: str | None = None
    base: str | None = None
    backend: str | None = None
    verdict: str | None = None

    def where(self, q: Select[Any], row: Any = GateRow) -> Select[Any]:
        """`q` narrowed on `row`'s columns of those names (a gate's, or a find's)."""
        if self.head:
            q = q.where(row.head.startswith(self.head, autoescape=True))
        if self.base:
            q = q.where(row.base.startswith(self.base, autoescape=True))
        if self.backend:
            q = q.where(row.backend == self.backend)
        if self.verdict == "waiting":
            q = q.where(row.verdict.is_(None))
        elif self.verdict:
            q = q.where(row.verdict == self.verdict)
        return q


def list_gates(
    session: Session, *, before_id: int | None = None, limit: int = 50, where: GateFilter | None = None
) -> tuple[list[GateRow], int | None]:
    """Newest first, those `where` keeps; returns the page and the cursor (an id) of the next
    page, or None."""
    q = select(GateRow).order_by(GateRow.id.desc()).limit(limit + 1)
    if before_id is not None:
        q = q.where(GateRow.id < before_id)
    if where is not None:
        q = where.where(q)
    rows = list(session.scalars(q))
    nxt = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], nxt


def gates_of_jobs(session: Session, job_ids: Sequence[int]) -> dict[int, list[GateRow]]:
    """Per job id, the gates that ran or reused it, newest first (jobs of no gate are absent)."""
    if not job_ids:
        return {}
    q = (
        select(GateJobRow.job_id, GateRow)
        .join(GateRow, GateRow.id == GateJobRow.gate_id)
        .where(GateJobRow.job_id.in_(list(job_ids)))
        .order_by(GateRow.id.desc())
    )
    out: dict[int, list[GateRow]] = {}
    for job_id, gate in session.execute(q):
        gates = out.setdefault(int(job_id), [])
        if all(g.id != gate.id for g in gates):
            gates.append(gate)
    return out


def gate_job_rows(session: Session, gate_id: int) -> list[tuple[GateJobRow, JobRow]]:
    """The gate's jobs with their job rows, in the order the gate recorded them."""
    return jobs_of_gates(session, [gate_id]).get(gate_id, [])


def jobs_of_gates(session: Session, gate_ids: Sequence[int]) -> dict[int, list[tuple[GateJobRow, JobRow]]]:
    """Per gate id, its jobs with their job rows in the order it recorded them (one query for a
    whole list page)."""
    if not gate_ids:
        return {}
    q = (
        select(GateJobRow, JobRow)
        .join(JobRow, JobRow.id == GateJobRow.job_id)
        .where(GateJobRow.gate_id.in_(list(gate_ids)))
        .order_by(GateJobRow.id)
    )
    out: dict[int, list[tuple[GateJobRow, JobRow]]] = {}
    for link, job in session.execute(q).unique():
        out.setdefault(link.gate_id, []).append((link, job))
    return out
