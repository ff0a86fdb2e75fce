"""The per-commit gate: run or reuse jobs for head and base, compare, and decide.

`evaluate_gate` is one idempotent step of a state machine kept entirely in the store: it
resolves the base, finds or submits each (suite, role) job under an idempotency key derived
from the gate run's id, and answers `waiting` until every job is final, then `done` with the
verdict. The API's `POST /api/v1/gate` is exactly one step; the CLI calls it until `done`,
drawing a progress bar from the jobs it lists. Nothing but jobs is stored, so a gate survives a
server restart and two gates of one commit share their jobs.

Exit codes: 0 pass, 1 regression or accuracy failure, 2 could not run (a job failed or was
cancelled, the base cannot be found, the server is down: the infrastructure, not the code).

`confirm`: time regressions are re-measured once by a second head job; a regression counts only
when the re-run regresses too (the re-run compares against the same base job).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.compare import (
    SEVERITY,
    CaseResult,
    Comparison,
    MetricResult,
    to_jsonable,
)

EXIT_PASS, EXIT_FAIL, EXIT_INFRA = 0, 1, 2
Role = Literal["head", "base", "confirm"]


class GateRequest(BaseModel):
    """What to gate. `head`/`base` are commits (full shas are best: the server may not know
    refs); `base` may also be `job:N`. Without base and baseline the head's parent is used."""

    model_config = ConfigDict(extra="forbid")

    head: str = Field(min_length=1, max_length=255)
    base: str | None = Field(None, max_length=255)
    baseline: str | None = Field(None, max_length=100)
    suites: list[str] = Field(
        default_factory=list, description="empty: every registered suite for the device"
    )
    preset: str = "gate"
    device: str = "cpu"
    world_size: int = Field(1, ge=1, le=4096)
    confirm: bool = False
    run_id: str = Field(
        "", max_length=64, description="the gate run: jobs it submits are keyed by it (empty: derived)"
    )

    @field_validator("suites")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    def key(self) -> str:
        """The run id, or a stable hash of the request (so a retried request reuses its jobs)."""
        if self.run_id:
            return self.run_id
        blob = json.dumps(self.model_dump(exclude={"run_id"}), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class GateJob:
    role: Role
    suite: str
    job_id: int
    status: str
    commit: str | None
    progress_done: int = 0
    progress_total: int = 0
    message: str = ""
    error: str | None = None
    reused: bool = False  # an existing job (earlier gate or run), not submitted by this gate


@dataclass
class Confirmation:
    """A time regression of the first head run and what the re-run said about it."""

    suite: str
    case: str
    fingerprint: str
    metric: str
    first_reason: str
    rerun_job: int
    rerun_verdict: str
    rerun_reason: str

    @property
    def confirmed(self) -> bool:
        return self.rerun_verdict == "regressed"


@dataclass
class GateState:
    phase: Literal["waiting", "done"]
    exit_code: int | None
    verdict: Literal["pass", "fail", "error"] | None
    reason: str
    head: str
    base: str | None
    base_source: str
    jobs: list[GateJob] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    confirmations: list[Confirmation] = field(default_factory=list)
    markdown: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable verdict (strict JSON: non-finite numbers become strings)."""
        return {
            "phase": self.phase,
            "exit_code": self.exit_code,
            "verdict": self.verdict,
            "reason": self.reason,
            "head": self.head,
            "base": self.base,
            "base_source": self.base_source,
            "jobs": to_jsonable(self.jobs),
            "confirmations": [
                {**to_jsonable(c), "confirmed": c.confirmed} for c in self.confirmations
            ],
            "comparisons": [c.to_dict() for c in self.comparisons],
            "markdown": self.markdown,
        }


class GateInputError(ValueError):
    """The request names an unknown suite/preset/baseline or an impossible combination."""


# A submit function: (suite, preset, commit, device, world_size, idempotency_key, labels) -> job id.
SubmitFn = Callable[..., int]


def _job_view(job: Any, role: Role, reused: bool) -> GateJob:
    return GateJob(
        role=role,
        suite=job.suite,
        job_id=job.id,
        status=job.status,
        commit=job.commit_sha,
        progress_done=job.progress_done or 0,
        progress_total=job.progress_total or 0,
        message=job.progress_message or "",
        error=job.error,
        reused=reused,
    )


def _suites_for(req: GateRequest) -> list[str]:
    from workers.registry import get_suite, suite_names
    from workers.suite import UnknownSuiteInput

    names = req.suites or [n for n in suite_names() if req.device in get_suite(n).devices]
    if not names:
        raise GateInputError(f"no suite to gate on device {req.device!r}; registered: {suite_names()}")
    for name in names:
        try:
            get_suite(name).resolve_params(req.preset)
        except UnknownSuiteInput as exc:
            raise GateInputError(str(exc)) from exc
    return names


class CannotRun(RuntimeError):
    """The service cannot run a job the gate needs (no executor, a world size it never offers)."""


def default_submit(engine: Any, settings: Any = None, executor: Any = None, wake: Any = None) -> SubmitFn:
    """Submit through the service's checked queue path (the same as `POST /api/v1/jobs`): the
    executor's limits are checked at once, so a job it can never run is an exit-2 answer now,
    not a job queued forever."""

    def submit(**kw: Any) -> int:
        from service import queue

        if settings is None:
            job, _ = queue.submit(engine, queue.JobRequest(**kw))
        else:
            try:
                job, _ = queue.submit_checked(engine, settings, kw, executor)
            except queue.InvalidJob as exc:
                raise CannotRun(str(exc)) from exc
        if wake is not None:
            wake()
        return int(job.id)

    return submit


def _service_repo() -> str | None:
    """The executors' repository (GDNVAL_REPO): it knows the head's parent when the client did not say."""
    import os

    from workers.snapshot import REPO_ENV

    return os.environ.get(REPO_ENV) or None


def evaluate_gate(engine: Any, req: GateRequest, submit: SubmitFn | None = None) -> GateState:
    """One step of the gate: find or submit every job, and decide once all are final."""
    from sqlalchemy.orm import Session

    from service.baselines import NotFound, resolve_base

    submit = submit or default_submit(engine)
    suites = _suites_for(req)
    with Session(engine) as s:
        try:
            base = resolve_base(s, req.head, base=req.base, baseline=req.baseline, repo=_service_repo())
        except NotFound as exc:
            return _done(GateState("done", EXIT_INFRA, "error", "", req.head, None, ""), EXIT_INFRA, "error",
                         f"could not run: {exc}")  # fmt: skip
        except ValueError as exc:  # both --base and --baseline
            raise GateInputError(str(exc)) from exc
        if base.kind == "job" and len(suites) > 1:
            raise GateInputError(
                f"base {base.source} is one job, but {len(suites)} suites were asked ({suites}); "
                "gate one suite against a job, or use a commit/baseline commit"
            )
    state = GateState("waiting", None, None, "", req.head, base.value, base.source)
    try:
        pairs = _jobs(engine, req, suites, base, state, submit)
    except CannotRun as exc:
        return _done(state, EXIT_INFRA, "error", f"could not run: {exc}")
    if pairs is None:
        return state

    broken = [j for j in state.jobs if j.status in ("failed", "cancelled")]
    if broken:
        why = "; ".join(f"{j.role} job {j.job_id} ({j.suite}) {j.status}: {_tail(j.error)}" for j in broken)
        return _done(state, EXIT_INFRA, "error", f"could not run: {why}")
    if any(j.status != "succeeded" for j in state.jobs):
        state.reason = "waiting for jobs"
        return state

    from service.baselines import compare_jobs

    with Session(engine) as s:
        state.comparisons = [compare_jobs(s, b.job_id, h.job_id) for _, h, b in pairs]
    if req.confirm:
        try:
            waiting = _confirm(engine, req, state, pairs, submit)
        except CannotRun as exc:
            return _done(state, EXIT_INFRA, "error", f"could not run the confirmation: {exc}")
        if waiting is not None:
            return waiting
    failing = [(cmp, c) for cmp in state.comparisons for c in cmp.failing_cases()]
    if failing:
        names = ", ".join(f"{cmp.suite}/{c.name} ({c.verdict})" for cmp, c in failing[:10])
        more = f" and {len(failing) - 10} more" if len(failing) > 10 else ""
        return _done(state, EXIT_FAIL, "fail", f"{len(failing)} failing case(s): {names}{more}")
    return _done(state, EXIT_PASS, "pass", "no regression, every bound holds")


def _jobs(
    engine: Any, req: GateRequest, suites: Sequence[str], base: Any, state: GateState, submit: SubmitFn
) -> list[tuple[str, GateJob, GateJob]] | None:
    """Find or submit the head and base job of every suite (None: the state is already done)."""
    pairs: list[tuple[str, GateJob, GateJob]] = []
    for suite in suites:
        head_job = _ensure_job(engine, req, suite, "head", req.head, submit)
        if base.kind == "job":
            base_job = _existing_job(engine, int(base.value), "base")
            if base_job is None:
                _done(state, EXIT_INFRA, "error", f"base job {base.value} does not exist")
                return None
            if base_job.suite != suite:
                raise GateInputError(
                    f"base job {base.value} ran suite {base_job.suite!r}, expected {suite!r}"
                )
        else:
            base_job = _ensure_job(engine, req, suite, "base", base.value, submit)
        state.jobs += [head_job, base_job]
        pairs.append((suite, head_job, base_job))
    return pairs


def _done(state: GateState, code: int, verdict: Literal["pass", "fail", "error"], reason: str) -> GateState:
    from service.report import gate_markdown

    state.phase, state.exit_code, state.verdict, state.reason = "done", code, verdict, reason
    state.markdown = gate_markdown(state)
    return state


def _tail(text: str | None) -> str:
    if not text:
        return "no reason recorded"
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no reason recorded"


def _existing_job(engine: Any, job_id: int, role: Role) -> GateJob | None:
    from sqlalchemy.orm import Session

    from service.models import Job

    with Session(engine) as s:
        job = s.get(Job, job_id)
        return _job_view(job, role, True) if job is not None else None


def _ensure_job(
    engine: Any, req: GateRequest, suite: str, role: Role, commit: str, submit: SubmitFn, key_extra: str = ""
) -> GateJob:
    """This gate's job for (suite, role): its own keyed job if submitted before, else the newest
    succeeded or in-flight job of the commit, else a new one."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from service.baselines import find_commit_job
    from service.models import Job

    key = f"gate:{req.key()}:{role}:{suite}:{commit}{key_extra}"[:200]
    with Session(engine) as s:
        own = s.scalars(select(Job).where(Job.idempotency_key == key)).first()
        if own is not None:
            return _job_view(own, role, False)
        if role != "confirm":
            for statuses in (("succeeded",), ("running", "queued")):
                found = find_commit_job(
                    s, commit, suite, preset=req.preset, device=req.device, world_size=req.world_size,
                    params={}, statuses=statuses,
                )  # fmt: skip
                if found is not None:
                    return _job_view(found, role, True)
    job_id = submit(
        suite=suite,
        preset=req.preset,
        params={},
        commit=commit,
        device=req.device,
        world_size=req.world_size,
        idempotency_key=key,
        labels={"gate": req.key(), "role": role},
    )
    with Session(engine) as s:
        return _job_view(s.get(Job, job_id), role, False)


def _confirm(
    engine: Any,
    req: GateRequest,
    state: GateState,
    pairs: Sequence[tuple[str, GateJob, GateJob]],
    submit: SubmitFn,
) -> GateState | None:
    """Re-run the head once for suites with time regressions; keep only confirmed ones.
    Returns a waiting/error state while re-runs are pending or broken, else None."""
    from sqlalchemy.orm import Session

    from service.baselines import compare_jobs

    reruns: list[tuple[int, GateJob]] = []
    for i, (suite, head, _base) in enumerate(pairs):
        if state.comparisons[i].time_regressions():
            job = _ensure_job(engine, req, suite, "confirm", req.head, submit, key_extra=f":{head.job_id}")
            state.jobs.append(job)
            reruns.append((i, job))
    broken = [j for _, j in reruns if j.status in ("failed", "cancelled")]
    if broken:
        why = "; ".join(f"confirm job {j.job_id} ({j.suite}) {j.status}: {_tail(j.error)}" for j in broken)
        return _done(state, EXIT_INFRA, "error", f"could not run: {why}")
    if any(j.status != "succeeded" for _, j in reruns):
        state.reason = "re-running time regressions to confirm them"
        return state
    for i, job in reruns:
        first = state.comparisons[i]
        with Session(engine) as s:
            again = compare_jobs(s, pairs[i][2].job_id, job.job_id)
        again_by = {(c.fingerprint, m.metric): m for c in again.cases for m in c.metrics}
        for case, metric in first.time_regressions():
            rerun = again_by.get((case.fingerprint, metric.metric))
            conf = Confirmation(
                first.suite, case.name, case.fingerprint, metric.metric, metric.reason, job.job_id,
                rerun.verdict if rerun else "removed",
                rerun.reason if rerun else "not measured by the re-run",
            )  # fmt: skip
            state.confirmations.append(conf)
            if not conf.confirmed:
                _unconfirm(case, metric, conf)
    return None


def _unconfirm(case: CaseResult, metric: MetricResult, conf: Confirmation) -> None:
    """A regression the re-run did not reproduce: recorded as inconclusive, with both reasons."""
    metric.verdict = "inconclusive"
    metric.reason = (
        f"not confirmed: first run {conf.first_reason}; re-run job {conf.rerun_job} "
        f"{conf.rerun_verdict}: {conf.rerun_reason}"
    )
    if case.verdict == "regressed":
        worst = min(case.metrics, key=lambda m: SEVERITY[m.verdict])
        case.verdict = worst.verdict
        case.reason = f"{worst.metric}: {worst.reason}"
