"""The durable job queue: jobs are rows, and every state change is one short write transaction.

Claims run under `write_tx` (SQLite: BEGIN IMMEDIATE; PostgreSQL: an advisory lock, see
service/persistence/db.py; so claims are serialised and the per-device limits hold across replicas) and the
status flip is a conditional UPDATE (`... WHERE status = 'queued'`), so two dispatchers, even in
two processes or on two hosts sharing one database, can never both run a job. A dispatcher
claims only what its executor can place now: per device kind, the best queued job (priority,
then age) is taken when it fits, and a job that does not fit holds back the later jobs of its
kind (no starvation of wide jobs) but never those of another kind. A dispatcher identifies
itself as `host:pid:nonce`; a running job whose dispatcher is gone (same host, dead pid) or
silent past the lease is an orphan and is settled: re-queued while it has attempts left, failed
with the reason otherwise.

A claimed job whose executor waits for its resources (a placement group waiting for nodes the
autoscaler was asked for) is shown `queued` again, held by its dispatcher (`claimed_by` stays set,
so no one else claims it; its reason is its progress message, `JobRow.waiting_for`), and
turns `running` when its ranks are placed (`hold`, `unhold`). Everything that follows a claim
(heartbeats, cancel, the end, orphans, the per-device limits) counts such a held job as its
dispatcher's, like a running one.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.persistence.commits import ensure_commit
from service.persistence.db import write_tx
from service.persistence.jobs import add_event
from service.persistence.models import FINAL_STATUSES, CampaignRow, JobEventRow, JobRow, utcnow
from service.persistence.records import JobRecord
from service.persistence.summaries import judge_job
from workers.backend_source import BACKEND_SOURCE_LABEL, BackendSource, BackendSourceError
from workers.executors.base import PLACEMENT_LABEL
from workers.job_env import pid_alive

if TYPE_CHECKING:
    pass


class JobNotFound(LookupError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job {job_id}")
        self.job_id = job_id


class JobConflict(RuntimeError):
    """The request is valid but contradicts the job's state (cancel a finished job, key reuse)."""


@dataclass(frozen=True)
class JobRequest:
    """A validated submission (the API checks suite, preset, params, device, world size)."""

    suite: str
    preset: str = "quick"
    params: Mapping[str, Any] = field(default_factory=dict)
    commit: str | None = None
    device: str = "cpu"
    world_size: int = 1
    priority: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    cases: tuple[str, ...] | None = None

    def same_as(self, job: JobRow) -> bool:
        return (
            (tuple(job.cases) if job.cases else None) == self.cases
            and job.suite == self.suite
            and job.preset == self.preset
            and dict(job.params or {}) == dict(self.params)
            and job.commit_sha == self.commit
            and job.device == self.device
            and job.world_size == self.world_size
        )


def dispatcher_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


Keyed = TypeVar("Keyed", JobRow, CampaignRow)
Record = TypeVar("Record")


def insert_once(
    engine: Engine,
    row_type: type[Keyed],
    key: str | None,
    *,
    same: Callable[[Keyed], bool],
    named: Callable[[Keyed], str],
    insert: Callable[[Session], Keyed],
    record: Callable[[Keyed], Record],
    what: str,
) -> tuple[Record, bool]:
    """Insert a row once per idempotency key, in one write transaction; returns (its record,
    created). A known `key` answers the row it names when `same` holds for it, else raises
    JobConflict saying what the key names (`named`); a concurrent insert of the same key (an
    IntegrityError on a non-SQLite store) is retried, then refused naming `what` failed."""
    for _ in range(3):
        try:
            with write_tx(engine) as s:
                if key:
                    row = s.scalars(select(row_type).where(row_type.idempotency_key == key)).first()
                    if row is not None:
                        if not same(row):
                            raise JobConflict(f"idempotency key {key!r} already names {named(row)}; "
                                              "use a new key")
                        return record(row), False
                return record(insert(s)), True
        except IntegrityError:  # a concurrent submit with the same key won on a non-SQLite store
            continue
    raise JobConflict(f"could not {what} with idempotency key {key!r}; retry")


def submit(engine: Engine, req: JobRequest) -> tuple[JobRecord, bool]:
    """Queue a job; returns (job, created). A known idempotency key returns its job unchanged.

    Raises JobConflict when the key is reused for a different request (suite, preset, params,
    commit, device or world size differ), rather than silently returning an unrelated job.
    """
    return insert_once(
        engine, JobRow, req.idempotency_key, same=req.same_as,
        named=lambda job: f"job {job.id} ({job.suite}/{job.preset} on {job.device}x{job.world_size}) with "
        "different parameters",
        insert=lambda s: insert_job(s, req), record=JobRecord.of, what="submit",
    )


def insert_job(s: Session, req: JobRequest) -> JobRow:
    """Add a queued job inside the caller's write transaction (`submit`, a campaign's jobs)."""
    job = JobRow(
        backend_commit=label_backend_commit(req.labels),
        suite=req.suite,
        preset=req.preset,
        params=dict(req.params),
        commit=ensure_commit(s, req.commit),
        device=req.device,
        world_size=req.world_size,
        priority=req.priority,
        labels=dict(req.labels),
        idempotency_key=req.idempotency_key,
        cases=list(req.cases) if req.cases else None,
        status="queued",
    )
    s.add(job)
    s.flush()
    add_event(s, job.id, "status", "queued")
    return job


def label_backend_commit(labels: Mapping[str, Any] | None) -> str | None:
    """The backend commit a job's `backend_source` label names by its full sha, else None."""
    text = (labels or {}).get(BACKEND_SOURCE_LABEL)
    if not text:
        return None
    try:
        return BackendSource.parse(str(text)).full_commit
    except BackendSourceError:
        return None


def job_backend_source(job: JobRow | JobRecord) -> str | None:
    """Where the job's backend under test comes from (its `backend_source` label), None for ours."""
    return (job.labels or {}).get(BACKEND_SOURCE_LABEL) or None


def job_backend_repo(job: JobRow | JobRecord) -> str | None:
    """The repository the job installed its backend under test from (its `backend_source` label's;
    a pip requirement stands for itself), None for ours."""
    source = job_backend_source(job)
    if source is None:
        return None
    try:
        return BackendSource.parse(source).repo or source
    except BackendSourceError:
        return source


def job_placement(job: JobRow) -> str | None:
    """The job's own placement strategy (its `placement` label), None for the executor's default."""
    return (job.labels or {}).get(PLACEMENT_LABEL) or None


def _held() -> Any:
    """The jobs a dispatcher holds: running, or claimed and waiting for resources (queued)."""
    return JobRow.claimed_by.is_not(None) & JobRow.status.in_(("running", "queued"))


def claim(
    engine: Engine,
    owner: str,
    limits: Mapping[str, int],
    fits: Callable[[JobRow], bool] | None = None,
) -> JobRow | None:
    """Atomically move the best queued job that may start now to `running` for `owner`.

    Per device kind with room under `limits`, the candidate is that kind's best queued job
    (highest priority, then oldest); `fits(job)` says whether the executor can place it now (a
    kind whose candidate does not fit claims nothing). Of the candidates that fit, the best one
    is claimed. Returns None when nothing may start now.
    """
    with write_tx(engine) as s:
        running = dict(
            s.execute(
                select(JobRow.device, func.count()).where(_held()).group_by(JobRow.device)
            ).all()
        )
        open_devices = [d for d, limit in limits.items() if running.get(d, 0) < limit]
        if not open_devices:
            return None
        candidates = []
        for device in open_devices:
            head = s.scalars(
                select(JobRow)
                .where(JobRow.status == "queued", JobRow.claimed_by.is_(None), JobRow.device == device)
                .order_by(JobRow.priority.desc(), JobRow.id)
                .limit(1)
            ).first()
            if head is not None and (fits is None or fits(head)):
                candidates.append(head)
        if not candidates:
            return None
        job = min(candidates, key=lambda j: (-j.priority, j.id))
        now = utcnow()
        res = s.execute(
            update(JobRow)
            .where(JobRow.id == job.id, JobRow.status == "queued", JobRow.claimed_by.is_(None))
            .values(
                status="running",
                claimed_by=owner,
                started_at=now,
                heartbeat_at=now,
                attempts=JobRow.attempts + 1,
                cancel_requested=False,
                error=None,
                progress_done=0,
                progress_total=0,
                progress_message="",
            )
            .execution_options(synchronize_session=False)
        )
        if res.rowcount != 1:  # another dispatcher took it (possible on non-SQLite stores)
            return None
        add_event(s, job.id, "status", "running", {"owner": owner, "attempt": job.attempts + 1})
        s.flush()
        s.refresh(job)
        return job


def hold(engine: Engine, job_id: int, owner: str, reason: str) -> bool:
    """Show `owner`'s claimed job as `queued` again, waiting for `reason` (its resources), still
    held by `owner`; False when it is not `owner`'s running or held job. A held job's reason is
    updated without a second status event."""
    with write_tx(engine) as s:
        job = s.get(JobRow, job_id)
        if job is None or job.claimed_by != owner or job.status not in ("running", "queued"):
            return False
        fresh = job.status == "running"
        job.status, job.progress_message = "queued", reason[:1000]
        if fresh:
            add_event(s, job_id, "status", "queued", {"waiting_for": reason, "owner": owner})
    return True


def unhold(engine: Engine, job_id: int, owner: str) -> bool:
    """`owner`'s held job got its resources: it is `running` from now (its start time too);
    False when it is not `owner`'s held job."""
    with write_tx(engine) as s:
        job = s.get(JobRow, job_id)
        if job is None or job.claimed_by != owner or job.status != "queued":
            return False
        job.status, job.started_at, job.progress_message = "running", utcnow(), ""
        add_event(s, job_id, "status", "running", {"owner": owner, "placed": True})
    return True


def cancel(engine: Engine, job_id: int) -> JobRow:
    """Cancel a queued job at once; ask a running one's executor to stop (its dispatcher sets
    the cancel event and records `cancelled` when the executor returns), and so a held one's."""
    with write_tx(engine) as s:
        job = s.get(JobRow, job_id)
        if job is None:
            raise JobNotFound(job_id)
        if job.status == "queued" and job.claimed_by is None:
            job.status, job.finished_at = "cancelled", utcnow()
            add_event(s, job.id, "status", "cancelled", {"reason": "cancelled while queued"})
        elif job.status in ("running", "queued"):
            if not job.cancel_requested:
                job.cancel_requested = True
                add_event(s, job.id, "status", "cancel requested")
        else:
            raise JobConflict(
                f"job {job_id} is already {job.status}; only queued or running jobs can be cancelled"
            )
        s.flush()
        return job


def finish(engine: Engine, job_id: int, owner: str, status: str, error: str | None = None) -> bool:
    """Record the end of `owner`'s run; False when the job is no longer `owner`'s running job
    (settled as an orphan meanwhile), in which case nothing changes."""
    if status not in FINAL_STATUSES:
        raise ValueError(f"final status must be one of {sorted(FINAL_STATUSES)}, got {status!r}")
    with write_tx(engine) as s:
        res = s.execute(
            update(JobRow)
            .where(JobRow.id == job_id, _held(), JobRow.claimed_by == owner)
            .values(status=status, error=error, finished_at=utcnow(), cancel_requested=False)
            .execution_options(synchronize_session=False)
        )
        if res.rowcount != 1:
            return False
        add_event(s, job_id, "status", status, {"error": error} if error else None)
    return True


def heartbeat(engine: Engine, owner: str, job_ids: list[int]) -> set[int]:
    """Refresh the lease of `owner`'s running jobs; returns those whose cancel was requested."""
    if not job_ids:
        return set()
    with write_tx(engine) as s:
        s.execute(
            update(JobRow)
            .where(JobRow.id.in_(job_ids), JobRow.claimed_by == owner, _held())
            .values(heartbeat_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        return set(
            s.scalars(
                select(JobRow.id).where(
                    JobRow.id.in_(job_ids),
                    (JobRow.cancel_requested.is_(True)) | ~_held() | (JobRow.claimed_by != owner),
                )
            )
        )


def _orphan_reason(job: JobRow, owner: str, lease_s: float, held_here: Collection[int] | None,
                   lease_ok: bool) -> tuple[str, bool] | None:
    """Why `job` (held by a dispatcher) is an orphan, and whether that counts as a crash; None
    while its dispatcher still runs it. `owner`'s own jobs are orphans only when the caller says
    which it runs (`held_here`) and this is not one of them (its thread lost it: the store did
    not answer its end), which is not the job's crash. Another dispatcher's silence counts only
    when `lease_ok` (this one has reached the store for a whole lease: after an outage every
    heartbeat is old, and the owner needs a tick to send its next one)."""
    if job.claimed_by == owner:
        if held_here is None or job.id in held_here:
            return None
        return "its dispatcher lost track of it while the store was unreachable", False
    host, _, rest = (job.claimed_by or "").partition(":")
    pid = rest.partition(":")[0]
    if host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
        return f"its dispatcher (pid {pid}) exited while it ran", True
    if lease_ok and (job.heartbeat_at is None or utcnow() - job.heartbeat_at > timedelta(seconds=lease_s)):
        return f"its dispatcher {job.claimed_by} sent no heartbeat for {lease_s:g} s", True
    return None


ORDERLY_REQUEUE = "service shut down while it ran"
# A run the cluster took down (it went away or restarted under the job) is not the job's crash,
# but a job that takes its cluster down each time must end: after this many such runs it fails.
MAX_CLUSTER_LOSSES = 5


def requeue_orderly(engine: Engine, job_id: int, owner: str, reason: str = ORDERLY_REQUEUE,
                    cluster_lost: bool = False) -> str | None:
    """Put `owner`'s running job back in the queue after something that is not the job's fault
    stopped it: an orderly shutdown, or (`cluster_lost`) its cluster going away under it.

    The run still counts as an attempt (its samples stay apart), but not as an interruption:
    only crashes use up `max_attempts` (see `settle_orphans`). A job whose cluster went away
    `MAX_CLUSTER_LOSSES` times is failed instead. Returns the job's new status, None when it is
    no longer `owner`'s running job."""
    with write_tx(engine) as s:
        mine = select(JobRow).where(JobRow.id == job_id, JobRow.claimed_by == owner, _held())
        job = s.scalars(mine).first()
        if job is None:
            return None
        losses = _requeues(s, job_id, "cluster_lost") + 1 if cluster_lost else 0
        if losses > MAX_CLUSTER_LOSSES:
            job.status, job.finished_at = "failed", utcnow()
            job.error = f"its cluster went away {losses} times while it ran; last: {reason}"
            add_event(s, job_id, "status", "failed", {"reason": job.error})
            judge_job(s, job, ran=False)
            return job.status
        job.status, job.claimed_by, job.heartbeat_at = "queued", None, None
        data: dict[str, Any] = {"reason": reason, "orderly": True}
        if cluster_lost:
            data["cluster_lost"] = True
        add_event(s, job_id, "status", "queued", data)
        return job.status


def _requeues(s: Any, job_id: int, flag: str = "orderly") -> int:
    """How many times the job was re-queued with `flag` in its event's data."""
    data = s.scalars(
        select(JobEventRow.data).where(JobEventRow.job_id == job_id, JobEventRow.kind == "status",
                                    JobEventRow.message == "queued")
    )
    return sum(1 for d in data if isinstance(d, dict) and d.get(flag) is True)


def settle_orphans(engine: Engine, owner: str, lease_s: float, max_attempts: int,
                   held_here: Collection[int] | None = None, lease_ok: bool = True) -> list[tuple[int, str]]:
    """Settle held jobs whose dispatcher died or lost them (`_orphan_reason`): re-queue while
    crashes remain under `max_attempts`, else fail. Runs ended by an orderly shutdown or a lost
    cluster (`requeue_orderly`), and own jobs lost to a store outage, are not crashes, so they
    never use up a job's retries.

    Returns (job id, new status) for every job settled. Samples already stored stay (they are
    kept per attempt); the re-run starts a new attempt, which keeps the cases that had finished
    (`service.persistence.resume`). A job failed or cancelled here gets its verdict (`errored`)
    and case counts.
    """
    settled: list[tuple[int, str]] = []
    with write_tx(engine) as s:
        for job in s.scalars(select(JobRow).where(_held())).unique():
            found = _orphan_reason(job, owner, lease_s, held_here, lease_ok)
            if found is None:
                continue
            reason, crash = found
            crashes = job.attempts - _requeues(s, job.id) - (0 if crash else 1)
            if job.cancel_requested:
                job.status, job.finished_at = "cancelled", utcnow()
                job.error = f"cancelled; {reason}"
                add_event(s, job.id, "status", "cancelled", {"reason": reason})
                judge_job(s, job, ran=False)
            elif crashes < max_attempts:
                job.status, job.claimed_by, job.heartbeat_at = "queued", None, None
                why = f"re-queued after attempt {job.attempts} was interrupted: {reason}"
                data: dict[str, Any] = {"reason": why}
                if not crash:
                    data["orderly"] = True
                add_event(s, job.id, "status", "queued", data)
            else:
                job.status, job.finished_at = "failed", utcnow()
                job.error = f"interrupted {crashes} time(s); last: {reason}"
                add_event(s, job.id, "status", "failed", {"reason": job.error})
                judge_job(s, job, ran=False)  # errored, with the cases it finished
            settled.append((job.id, job.status))
    return settled
