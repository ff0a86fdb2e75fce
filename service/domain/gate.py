"""The per-commit gate: run or reuse jobs for head and base, compare, and decide.

`evaluate_gate` is one idempotent step of a state machine kept entirely in the store: it
checks the whole request first (every suite, preset, parameter, device and world size, and the
refs, before any job is queued), resolves the base, finds or submits each (suite, role) job
under an idempotency key derived from the gate run's id, and answers `waiting` until every job
is final, then `done` with the verdict. The API's `POST /api/v1/gate` is exactly one step; the
CLI calls it until `done`, drawing a progress bar from the jobs it lists. Nothing but jobs is
stored, so a gate survives a server restart and two gates of one commit share their jobs.

Exit codes: 0 pass, 1 regression or failure (a failing metric, or a case that errors at head
but not at base), 2 could not decide or could not run (a job failed, the base cannot be found,
the jobs are not comparable, a case errors on both sides, or a time change stays undecided).
On exit 2 the jobs this gate queued and that are still pending are cancelled.

Enough evidence, or say so: a time metric whose change exceeds its minimum effect but is not
significant (`inconclusive`) is measured again — `max_rounds` rounds of just those cases, a base
job then a head job each round (interleaved, so drift on a shared device cancels), pooled with
what was measured before — until decided; still undecided -> exit 2 naming the cases.

`confirm` (on by default for cpu, where timings shift from one process to the next): the cases
with time regressions are measured again by a fresh base job and then a fresh head job, and that
pair's verdict of each regressed metric decides it (`confirmation_outcome`): regressed (or
failed) confirms it; unchanged or improved clears it (shown as `changed`, never failing);
anything else neither confirms nor clears it. A pair that is beyond the minimum effect but not
significant gets the same rounds as above (of the pair, pooled with it, never with the first run);
still undecided, or not measured by the pair at all, the metric is `inconclusive` -> exit 2
naming the case, never a pass.

The preset: `preset`, or each suite's `gate_presets[device]` (`gate` on cuda/npu, `gate-cpu` on
cpu). The default suites: every registered suite whose preset has a case that runs on the device
at the world size (`submission.runs_here`); with `backend` (a gate of that backend's own
repository), the suites that call it with the parameters that make them do so
(service.domain.backend_gate), a suite that would not being refused. A base equal to the head
needs `reuse` false.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from service.domain import submission
from service.domain.backend_gate import BACKEND_SUITES, NeverCallsBackend, check_calls_backend, suite_params
from service.domain.baselines import NotFound, compare_jobs, compare_pooled, parse_job_ref, resolve_base
from service.domain.compare import (
    FAILING,
    SEVERITY,
    VERDICTS,
    CaseResult,
    Comparison,
    MetricResult,
    to_jsonable,
)
from service.persistence import gates as gate_store
from service.persistence import queue
from service.persistence.gates import GateJobLink
from service.persistence.jobs import find_commit_job, job_by_idempotency_key, job_record
from service.persistence.records import JobRecord
from workers.backend_source import BACKEND_SOURCE_LABEL, BackendSource, BackendSourceError
from workers.refs import check_commit
from workers.registry import get_suite, suite_names
from workers.snapshot import REPO_ENV
from workers.suite import UnknownSuiteInput
from workers.verdict import ALPHA, min_two_sided_p

EXIT_PASS, EXIT_FAIL, EXIT_INFRA = 0, 1, 2
ConfirmOutcome = Literal["confirmed", "cleared", "undecided"]
# The confirmation pair's verdicts that clear a time regression: within the minimum effect, or better.
CLEARS: frozenset[str] = frozenset({"unchanged", "improved"})
Role = Literal["head", "base", "confirm-base", "confirm", "round-base", "round-head"]


class GateRequest(BaseModel):
    """What to gate. `head`/`base` are commits (full shas are best: the server may not know
    refs); `base` may also be `job:N`. Without base and baseline the head's parent is used."""

    model_config = ConfigDict(extra="forbid", strict=True)

    head: str = Field(min_length=1, max_length=255)
    base: str | None = Field(None, max_length=255, description="a commit, or 'job:N'")
    baseline: str | None = Field(None, max_length=100)
    suites: list[str] = Field(
        default_factory=list,
        description="empty: every registered suite that runs on the device at the world size",
    )
    preset: str | None = Field(
        None, max_length=50, description="null: each suite's gate preset for the device (gate-cpu on cpu)"
    )
    device: Literal["cuda", "npu", "cpu"] = "cpu"
    world_size: int = Field(1, ge=1, le=4096)
    params: dict[str, JsonValue] = Field(
        default_factory=dict, description="parameter overrides applied to every gated suite"
    )
    confirm: bool | None = Field(
        None, description="re-measure time regressions on both sides before counting them; null: on "
        "for cpu (a CPU job's timings shift from process to process), off elsewhere",
    )
    reuse: bool = Field(
        True, description="reuse a commit's existing job of the same setting; false: measure anew "
        "(the head and base jobs are this gate's own, even for one commit against itself)"
    )
    max_rounds: int = Field(
        3, ge=0, le=20, description="re-measurement rounds for time changes not yet significant"
    )
    run_id: str = Field(
        "", max_length=64, description="the gate run: jobs it submits are keyed by it (empty: derived)"
    )
    backend_repo: str | None = Field(
        None, min_length=1, max_length=1000,
        description="head and base are commits of this backend repository (a git path or URL the "
        "service host reads), installed per commit as the jobs' backend source; our code runs as "
        "the service has it. Needs an explicit base commit and `backend`",
    )
    backend: str | None = Field(
        None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:+-]+$",
        description="the backend under test (an entry point name): the default suites become those "
        "that call it (gdn-op and capability beside eager, both timed; cp-layer under its CP layouts)",
    )

    @model_validator(mode="after")
    def _backend_base(self) -> GateRequest:
        if self.backend_repo and (self.base is None or parse_job_ref(self.base) is not None):
            raise ValueError(f"backend_repo {self.backend_repo!r} needs base as a commit of that repository, "
                             f"got base={self.base!r}")
        if self.backend_repo and not self.backend:
            raise ValueError(f"backend_repo {self.backend_repo!r} needs backend: the name of the entry point "
                             "(group gdnval.backends) its jobs must call")
        return self

    @model_validator(mode="after")
    def _not_itself(self) -> GateRequest:
        if self.base is not None and self.base == self.head and self.reuse:
            raise ValueError(f"base is head ({self.head!r}): the gate would compare that commit's job with "
                             "itself; set reuse false (--fresh) to measure it anew, or name another base")
        return self

    @field_validator("suites")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @field_validator("head")
    @classmethod
    def _head(cls, v: str) -> str:
        return check_commit(v, "head")

    @field_validator("base")
    @classmethod
    def _base(cls, v: str | None) -> str | None:
        return v if v is None or parse_job_ref(v) is not None else check_commit(v, "base")

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


def confirmation_outcome(rerun_verdict: str) -> ConfirmOutcome:
    """What a confirmation pair's verdict of a regressed time metric makes of the regression. Only
    evidence decides: a failing verdict (regressed, or its bound / a non-finite value) confirms it,
    one within the minimum effect or better clears it; `inconclusive` (beyond the minimum effect,
    not significant after the pair's rounds) and verdicts that judged nothing (changed, removed:
    not measured by the pair, ...) leave it undecided, which is exit 2 and never a pass."""
    if rerun_verdict not in VERDICTS:
        raise ValueError(f"re-run verdict {rerun_verdict!r} is not a verdict; expected one of {VERDICTS}")
    if rerun_verdict in FAILING:
        return "confirmed"
    return "cleared" if rerun_verdict in CLEARS else "undecided"


@dataclass
class Confirmation:
    """A time regression of the first head run and what the re-run (its confirmation pair, pooled
    with that pair's rounds if it had any) said about it."""

    suite: str
    case: str
    fingerprint: str
    metric: str
    first_reason: str
    rerun_job: int
    rerun_verdict: str
    rerun_reason: str

    @property
    def outcome(self) -> ConfirmOutcome:
        return confirmation_outcome(self.rerun_verdict)

    @property
    def confirmed(self) -> bool:
        return self.outcome == "confirmed"

    def to_dict(self) -> dict[str, Any]:
        return {**to_jsonable(self), "confirmed": self.confirmed, "outcome": self.outcome}


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
    rounds: int = 0  # re-measurement rounds run (of the first pairs and of confirmation pairs)
    undecided: list[str] = field(default_factory=list)  # suite/case names left undecided
    gate_id: int | None = None  # the stored gate (its page is /gates/ID)

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
            "confirmations": [c.to_dict() for c in self.confirmations],
            "rounds": self.rounds,
            "undecided": list(self.undecided),
            "comparisons": [c.to_dict() for c in self.comparisons],
            "gate_id": self.gate_id,
        }


class GateInputError(ValueError):
    """The request names an unknown suite/preset/baseline or an impossible combination."""


# A submit function: (suite, preset, commit, device, world_size, idempotency_key, labels) -> job id.
SubmitFn = Callable[..., int]


def _job_view(job: JobRecord, role: Role, reused: bool) -> GateJob:
    return GateJob(
        role=role,
        suite=job.suite,
        job_id=job.id,
        status=job.status,
        commit=job.code_commit,
        progress_done=job.progress_done or 0,
        progress_total=job.progress_total or 0,
        message=job.progress_message or "",
        error=job.error,
        reused=reused,
    )


def preset_for(req: GateRequest, suite: str) -> str:
    """The preset a suite is gated with: the request's, or the suite's gate preset for the device."""
    return req.preset or get_suite(suite).gate_presets.get(req.device, "gate")


def params_for(req: GateRequest, suite: str) -> dict[str, Any]:
    """The parameter overrides of a suite's jobs: the gated backend's, then the request's."""
    return suite_params(suite, req.backend, req.world_size, req.params)


def _suites_for(req: GateRequest) -> list[str]:
    """The suites to gate: the request's, or every registered one (with a backend: every one that
    calls it) that runs on the device at the world size (with a preset for it)."""
    if req.suites:
        return list(req.suites)
    names = []
    for n in BACKEND_SUITES if req.backend else suite_names():
        suite = get_suite(n)
        preset = req.preset or suite.gate_presets.get(req.device, "gate")
        if submission.runs_here(suite, preset, req.device, req.world_size):
            names.append(n)
    if not names:
        raise GateInputError(
            f"no suite runs on device {req.device!r} at world size {req.world_size}; "
            f"registered: {suite_names()}"
        )
    return names


def validate_gate(req: GateRequest, executor: Any = None) -> list[str]:
    """Every suite of the gate checked as a submission would be (suite, preset, parameters,
    device, world size, executor limits; the head and a commit base against the commit rule),
    before anything is queued. Returns the suites; raises GateInputError naming the first problem."""
    suites = _suites_for(req)
    commits = [req.head] + ([req.base] if req.base and parse_job_ref(req.base) is None else [])
    for suite in suites:
        try:
            get_suite(suite)
        except UnknownSuiteInput as exc:
            raise GateInputError(str(exc)) from exc
        for commit in commits:
            body = {"suite": suite, "preset": preset_for(req, suite), "params": params_for(req, suite),
                    "commit": commit, "device": req.device, "world_size": req.world_size}
            try:
                submission.validate_request(body, executor)
            except submission.InvalidJob as exc:
                raise GateInputError(f"suite {suite!r}: {exc}") from exc
            except ValueError as exc:  # pydantic: a ref that breaks the commit rule
                raise GateInputError(f"suite {suite!r}: {_first_error(exc)}") from exc
        if req.backend:
            try:
                preset = preset_for(req, suite)
                check_calls_backend(suite, preset, params_for(req, suite), req.backend, req.device)
            except NeverCallsBackend as exc:
                raise GateInputError(str(exc)) from exc
    return suites


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg')}"
    return str(exc)


class CannotRun(RuntimeError):
    """The service cannot run a job the gate needs (no executor, a world size it never offers)."""


def default_submit(engine: Any, settings: Any = None, executor: Any = None, wake: Any = None) -> SubmitFn:
    """Submit through the service's checked queue path (the same as `POST /api/v1/jobs`): the
    executor's limits are checked at once, so a job it can never run is an exit-2 answer now,
    not a job queued forever."""

    def submit(**kw: Any) -> int:
        if settings is None:
            cases = kw.pop("cases", None)
            job, _ = queue.submit(engine, queue.JobRequest(**kw, cases=tuple(cases) if cases else None))
        else:
            try:
                job, _ = submission.submit_checked(engine, settings, kw, executor)
            except submission.InvalidJob as exc:
                raise CannotRun(str(exc)) from exc
        if wake is not None:
            wake()
        return int(job.id)

    submit.executor = executor  # type: ignore[attr-defined]  # validate_gate checks its limits
    return submit


def _service_repo() -> str | None:
    """The executors' repository (GDNVAL_REPO): it knows the head's parent when the client did not say."""
    import os

    return os.environ.get(REPO_ENV) or None


def evaluate_gate(engine: Any, req: GateRequest, submit: SubmitFn | None = None) -> GateState:
    """One step of the gate: find or submit every job, decide once all are final, and record
    where it stands (the gate's row: request, jobs, rounds, confirmations, verdict, findings)."""
    state = _step(engine, req, submit)
    state.gate_id = record_gate(engine, req, state)
    return state


def findings(comparisons: Sequence[Comparison]) -> list[dict[str, Any]]:
    """Every case that did not stay unchanged (or improve) and why, per metric: what a gate's
    page lists as the reason of its verdict."""
    out: list[dict[str, Any]] = []
    for cmp in comparisons:
        for c in cmp.cases:
            if c.verdict in ("unchanged", "improved"):
                continue
            where = {"suite": cmp.suite, "case": c.name, "fingerprint": c.fingerprint,
                     "case_verdict": c.verdict, "head_job": cmp.head.job_id,
                     "base_job": cmp.base.job_id}
            metrics = [m for m in c.metrics if m.verdict not in ("unchanged", "improved")]
            for m in metrics:
                out.append({**where, "metric": m.metric, "kind": m.kind, "verdict": m.verdict,
                            "reason": m.reason})
            if not metrics:
                out.append({**where, "metric": None, "kind": None, "verdict": c.verdict, "reason": c.reason})
    return out


def record_gate(engine: Any, req: GateRequest, state: GateState) -> int:
    """Store the gate's state under its run id (created at its first step); returns the gate's id."""
    fields = {
        "head": state.head, "base": state.base, "base_source": state.base_source[:500],
        "backend": req.backend, "backend_repo": req.backend_repo, "device": req.device,
        "world_size": req.world_size,
        "phase": state.phase, "verdict": state.verdict, "exit_code": state.exit_code, "reason": state.reason,
        "rounds": state.rounds, "undecided": list(state.undecided), "findings": findings(state.comparisons),
        "confirmations": [c.to_dict() for c in state.confirmations],
    }
    links = [GateJobLink(j.job_id, j.role, j.suite, j.reused) for j in state.jobs]
    return gate_store.save_gate(engine, req.key(), req.model_dump(mode="json"), fields, links)


def _step(engine: Any, req: GateRequest, submit: SubmitFn | None = None) -> GateState:
    from sqlalchemy.orm import Session

    submit = submit or default_submit(engine)
    suites = validate_gate(req, getattr(submit, "executor", None))
    with Session(engine) as s:
        try:
            base = resolve_base(s, req.head, base=req.base, baseline=req.baseline, repo=_service_repo())
        except NotFound as exc:
            return _done(GateState("done", EXIT_INFRA, "error", "", req.head, None, ""), EXIT_INFRA, "error",
                         f"could not run: {exc}")
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
        return _give_up(engine, state, f"could not run: {exc}")
    if pairs is None:
        return state

    unsettled = _unsettled(engine, state, state.jobs, "could not run", "waiting for jobs")
    if unsettled is not None:
        return unsettled

    with Session(engine) as s:
        state.comparisons = [compare_jobs(s, b.job_id, h.job_id) for _, h, b in pairs]
    incomparable = [cmp for cmp in state.comparisons if any(c.verdict == "incomparable" for c in cmp.cases)]
    if incomparable:
        why = "; ".join(f"{cmp.suite}: {cmp.cases[0].reason}" for cmp in incomparable)
        return _give_up(engine, state, f"could not decide: {why}")
    try:
        waiting = _measure_again(engine, req, state, pairs, state.comparisons, submit, "round")
    except CannotRun as exc:
        return _give_up(engine, state, f"could not run a re-measurement: {exc}")
    if waiting is not None:
        return waiting
    if req.confirm or (req.confirm is None and req.device == "cpu"):
        try:
            waiting = _confirm(engine, req, state, pairs, submit)
        except CannotRun as exc:
            return _give_up(engine, state, f"could not run the confirmation: {exc}")
        if waiting is not None:
            return waiting
    failing = [(cmp, c) for cmp in state.comparisons for c in cmp.failing_cases() if not _errored_both(c)]
    if failing:
        names = ", ".join(f"{cmp.suite}/{c.name} ({c.verdict})" for cmp, c in failing[:10])
        more = f" and {len(failing) - 10} more" if len(failing) > 10 else ""
        return _done(state, EXIT_FAIL, "fail", f"{len(failing)} failing case(s): {names}{more}")
    both = [f"{cmp.suite}/{c.name}" for cmp in state.comparisons for c in cmp.cases if _errored_both(c)]
    if both:
        why = f"could not decide: case(s) error on both sides: {', '.join(both[:10])}"
        return _give_up(engine, state, why)
    undecided = _undecided(state.comparisons)
    if undecided:
        state.undecided = [f"{suite}/{case}" for suite, case in undecided]
        pending = [f"{c.suite}/{c.case}" for c in state.confirmations if c.outcome == "undecided"]
        unconfirmed = (f"; regressions their confirmation pair neither confirmed nor cleared in "
                       f"{', '.join(dict.fromkeys(pending[:10]))}" if pending else "")
        return _give_up(
            engine, state,
            f"could not decide after {state.rounds} re-measurement round(s): time changes beyond the "
            f"minimum effect but not significant in {', '.join(state.undecided[:10])}{unconfirmed}",
        )
    return _done(state, EXIT_PASS, "pass", "no regression, every bound holds")


def _errored_both(c: CaseResult) -> bool:
    return c.base_status == "error" and c.head_status == "error"


def _undecided(
    comparisons: Sequence[Comparison],
    reachable: tuple[int, int] | None = None,
    only: Container[tuple[str, str, str]] | None = None,
) -> list[tuple[str, str]]:
    """(suite, case name) of every case with a time change beyond its minimum effect that is not
    significant yet; with `reachable` (rounds done, rounds allowed), only those that more rounds
    could still make significant; with `only`, only these (suite, fingerprint, metric)."""
    return [
        (cmp.suite, c.name)
        for cmp in comparisons
        for c in cmp.cases
        if any(m.verdict == "inconclusive" and m.kind == "time"
               and (only is None or (cmp.suite, c.fingerprint, m.metric) in only)
               and (reachable is None or _can_reach_significance(m, *reachable)) for m in c.metrics)
    ]


def _can_reach_significance(m: MetricResult, done: int, allowed: int) -> bool:
    """Whether pooling `allowed - done` more rounds (each as many values per side as the first
    job) can give the Mann-Whitney U test a p-value under `ALPHA` at all. A metric with one value
    per case and job (a throughput derived once per case) cannot within a few rounds: measuring
    it again only costs time."""
    per_job = [(s.count if s is not None else 0) / (done + 1) for s in (m.base, m.head)]
    n_base, n_head = (int(c * (allowed + 1)) for c in per_job)
    return min_two_sided_p(n_base, n_head) < ALPHA


def _measure_again(
    engine: Any,
    req: GateRequest,
    state: GateState,
    pairs: Sequence[tuple[str, GateJob, GateJob]],
    comparisons: list[Comparison],
    submit: SubmitFn,
    kind: Literal["round", "confirm"],
    only: Container[tuple[str, str, str]] | None = None,
) -> GateState | None:
    """Re-measure the undecided cases of `comparisons` (one per pair; with `only`, undecided in
    those (suite, fingerprint, metric)), round by round (a base job, then a head job, of just those
    cases), pooling every round with the pair's jobs, until decided or `max_rounds` are spent.
    `kind`: rounds of the first pairs, or of confirmation pairs (their jobs' roles). Returns a
    waiting/error state while a round runs or broke, else None (`comparisons` are then the pooled
    ones, replaced in place)."""
    from sqlalchemy.orm import Session

    pools = {suite: ([base.job_id], [head.job_id]) for suite, head, base in pairs}
    what = "undecided case(s)" if kind == "round" else "case(s) whose confirmation is undecided"
    for rnd in range(1, req.max_rounds + 1):
        undecided: dict[str, list[str]] = {}
        for suite, case in _undecided(comparisons, reachable=(rnd - 1, req.max_rounds), only=only):
            undecided.setdefault(suite, []).append(case)
        if not undecided:
            return None
        round_jobs: list[tuple[str, GateJob, GateJob]] = []
        for suite, names in undecided.items():
            head = next(h for s_, h, _ in pairs if s_ == suite)
            base = next(b for s_, _, b in pairs if s_ == suite)
            b, h = _measure_pair(engine, req, state, submit, kind, suite, base, head, names, f":r{rnd}")
            round_jobs.append((suite, h, b))
        waiting = f"re-measuring {sum(map(len, undecided.values()))} {what}, round {rnd}"
        jobs = [j for _, h, b in round_jobs for j in (b, h)]
        unsettled = _unsettled(engine, state, jobs, "could not run a re-measurement", waiting)
        if unsettled is not None:
            return unsettled
        state.rounds += 1
        for suite, h, b in round_jobs:
            pools[suite][0].append(b.job_id)
            pools[suite][1].append(h.job_id)
        with Session(engine) as s:
            comparisons[:] = [compare_pooled(s, *pools[suite]) for suite, _, _ in pairs]
    return None


def _measure_pair(
    engine: Any, req: GateRequest, state: GateState, submit: SubmitFn, kind: Literal["round", "confirm"],
    suite: str, base: GateJob, head: GateJob, cases: Sequence[str], key_extra: str = "",
) -> tuple[GateJob, GateJob]:
    """A fresh base job, then a fresh head job (queued in that order, so on a shared device they
    interleave with the other pairs), of just `cases`, in the setting of the first pair."""
    extra = f"{key_extra}:{head.job_id}:{base.job_id}"
    roles: tuple[Role, Role] = ("round-base", "round-head")
    if kind == "confirm":
        roles = ("confirm-base", "confirm")
    b = _ensure_job(engine, req, suite, roles[0], base.commit or state.base or "", submit,
                    key_extra=extra, cases=cases, like=base)
    h = _ensure_job(engine, req, suite, roles[1], req.head, submit, key_extra=extra, cases=cases, like=head)
    state.jobs += [b, h]
    return b, h


def _unsettled(
    engine: Any, state: GateState, jobs: Sequence[GateJob], broken_why: str, waiting_why: str
) -> GateState | None:
    """Exit 2 naming the jobs that failed or were cancelled; the waiting state while any other
    has not succeeded; None once all have."""
    broken = [j for j in jobs if j.status in ("failed", "cancelled")]
    if broken:
        why = "; ".join(f"{j.role} job {j.job_id} ({j.suite}) {j.status}: {_tail(j.error)}" for j in broken)
        return _give_up(engine, state, f"{broken_why}: {why}")
    if any(j.status != "succeeded" for j in jobs):
        state.reason = waiting_why
        return state
    return None


def _give_up(engine: Any, state: GateState, reason: str) -> GateState:
    """Exit 2; the jobs this gate queued that have not ended are cancelled (reused ones stay)."""
    cancelled = []
    for j in state.jobs:
        if not j.reused and j.status in ("queued", "running"):
            try:
                queue.cancel(engine, j.job_id)
                cancelled.append(j.job_id)
            except (queue.JobNotFound, queue.JobConflict):
                continue  # ended meanwhile
    if cancelled:
        reason = f"{reason} (cancelled the gate's pending job(s) {cancelled})"
    return _done(state, EXIT_INFRA, "error", reason)


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
                _give_up(engine, state, f"base job {base.value} does not exist")
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
    state.phase, state.exit_code, state.verdict, state.reason = "done", code, verdict, reason
    return state


def _tail(text: str | None) -> str:
    if not text:
        return "no reason recorded"
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no reason recorded"


def _existing_job(engine: Any, job_id: int, role: Role) -> GateJob | None:
    from sqlalchemy.orm import Session

    with Session(engine) as s:
        job = job_record(s, job_id)
        return _job_view(job, role, True) if job is not None else None


def _same_backend_repo(job: JobRecord, repo: str | None) -> bool:
    """Whether a job's backend comes from `repo` (None: the job runs no backend from elsewhere)."""
    source = queue.job_backend_source(job)
    if repo is None or source is None:
        return repo is None and source is None
    try:
        return BackendSource.parse(source).repo == repo
    except BackendSourceError:
        return False


def _ensure_job(
    engine: Any,
    req: GateRequest,
    suite: str,
    role: Role,
    commit: str,
    submit: SubmitFn,
    key_extra: str = "",
    cases: Sequence[str] | None = None,
    like: GateJob | None = None,
) -> GateJob:
    """This gate's job for (suite, role): its own keyed job if submitted before, else (head and
    base only) the newest succeeded or in-flight job of the commit with the same setting, else a
    new one. `cases`: run only these (re-measurements); `like`: the job whose setting it repeats."""
    from sqlalchemy.orm import Session

    preset = preset_for(req, suite)
    key = f"gate:{req.key()}:{role}:{suite}:{commit}{key_extra}"[:200]
    with Session(engine) as s:
        own = job_by_idempotency_key(s, key)
        if own is not None:
            return _job_view(own, role, False)
        if role in ("head", "base") and req.reuse:
            for statuses in (("succeeded",), ("running", "queued")):
                found = find_commit_job(
                    s, commit, suite, preset=preset, device=req.device, world_size=req.world_size,
                    params=params_for(req, suite), statuses=statuses, backend=bool(req.backend_repo),
                )
                if found is not None and _same_backend_repo(found, req.backend_repo):
                    return _job_view(found, role, True)
        if like is not None:
            template = job_record(s, like.job_id)
            preset = template.preset if template is not None else preset
    extra: dict[str, Any] = {"cases": list(cases)} if cases else {}
    labels = {"gate": req.key(), "role": role}
    if req.backend_repo:  # the commits are the backend's: installed per job, our code as it is
        labels[BACKEND_SOURCE_LABEL] = f"git+{req.backend_repo}@{commit}"
    job_id = submit(
        suite=suite,
        preset=preset,
        params=params_for(req, suite),
        commit=None if req.backend_repo else commit,
        device=req.device,
        world_size=req.world_size,
        idempotency_key=key,
        labels=labels,
        **extra,
    )
    with Session(engine) as s:
        job = job_record(s, job_id)
    if job is None:
        raise CannotRun(f"job {job_id} was submitted but is not in the store")
    return _job_view(job, role, False)


def _confirm(
    engine: Any,
    req: GateRequest,
    state: GateState,
    pairs: Sequence[tuple[str, GateJob, GateJob]],
    submit: SubmitFn,
) -> GateState | None:
    """Measure the cases with time regressions again, a fresh base job then a fresh head job
    (new processes on both sides: an offset of one process's timings cannot repeat), give that
    pair the rounds an undecided change gets (pooled with the pair only: the first run is what is
    in question), and settle each regression by the pair's verdict (`confirmation_outcome`).
    Returns a waiting/error state while re-runs are pending or broken, else None."""
    from sqlalchemy.orm import Session

    reruns: list[tuple[int, GateJob, GateJob]] = []
    for i, (suite, head, base) in enumerate(pairs):
        regressed = state.comparisons[i].time_regressions()
        if not regressed:
            continue
        names = list(dict.fromkeys(c.name for c, _ in regressed))
        b, h = _measure_pair(engine, req, state, submit, "confirm", suite, base, head, names)
        reruns.append((i, b, h))
    jobs = [j for _, b, h in reruns for j in (b, h)]
    waiting = "re-measuring time regressions on both sides to confirm them"
    unsettled = _unsettled(engine, state, jobs, "could not run", waiting)
    if unsettled is not None:
        return unsettled
    confirm_pairs = [(pairs[i][0], h, b) for i, b, h in reruns]
    with Session(engine) as s:
        again = [compare_jobs(s, b.job_id, h.job_id) for _, h, b in confirm_pairs]
    questioned = {(pairs[i][0], c.fingerprint, m.metric)
                  for i, _, _ in reruns for c, m in state.comparisons[i].time_regressions()}
    rounds_before = state.rounds
    waiting_round = _measure_again(engine, req, state, confirm_pairs, again, submit, "confirm", questioned)
    if waiting_round is not None:
        return waiting_round
    extra_rounds = state.rounds - rounds_before
    pooled_note = f"; the pair pooled with {extra_rounds} round(s)" if extra_rounds else ""
    for (i, _, head_job), pooled in zip(reruns, again, strict=True):
        first = state.comparisons[i]
        again_by = {(c.fingerprint, m.metric): m for c in pooled.cases for m in c.metrics}
        for case, metric in first.time_regressions():
            rerun = again_by.get((case.fingerprint, metric.metric))
            conf = Confirmation(
                first.suite, case.name, case.fingerprint, metric.metric, metric.reason, head_job.job_id,
                rerun.verdict if rerun else "removed",
                (rerun.reason if rerun else "not measured by the re-run") + pooled_note,
            )
            state.confirmations.append(conf)
            if not conf.confirmed:
                _unconfirm(case, metric, conf)
    return None


def _unconfirm(case: CaseResult, metric: MetricResult, conf: Confirmation) -> None:
    """A regression its confirmation pair did not confirm, with both reasons: cleared, it is
    `changed` (shown, never failing, never re-measured); undecided, it is `inconclusive`, which
    the gate's undecided path reports (exit 2 naming the case)."""
    cleared = conf.outcome == "cleared"
    metric.verdict = "changed" if cleared else "inconclusive"
    metric.reason = (
        f"{'not confirmed' if cleared else 'neither confirmed nor cleared'}: first run {conf.first_reason}; "
        f"re-run job {conf.rerun_job} {conf.rerun_verdict}: {conf.rerun_reason}"
    )
    if case.verdict == "regressed":
        worst = min(case.metrics, key=lambda m: SEVERITY[m.verdict])
        case.verdict = worst.verdict
        case.reason = f"{worst.metric}: {worst.reason}"
