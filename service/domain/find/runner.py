"""Running a find: each step is a gate (`service.domain.gate.evaluate_gate`) of one commit of
the range against the good commit, with the request's suites, presets and parameters; what the
gate exits with makes the commit good, bad or skipped (`bisect.next_step`). A step's gate is
stored like any gate and recorded as the find's step once it is done, so a later step never
re-judges an earlier one (a newer job at a commit would otherwise change what was decided).
Like the gate, `evaluate_find` is one idempotent step of a state machine kept in the store:
call it again with the same request until it is done."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy.orm import Session

from service.domain.baselines import parse_job_ref
from service.domain.commit_range import RangeError, backend_repository, first_parent, service_repository
from service.domain.compare import to_jsonable
from service.domain.find.bisect import OUTCOME_OF_EXIT, Next, Outcome, StepKind, measured_bound, next_step
from service.domain.gate import GateInputError, GateJob, GateRequest, SubmitFn, evaluate_gate
from service.persistence import finds as find_store
from service.persistence.finds import FindStep
from workers.refs import check_commit

MAX_RANGE = 10_000


class FindInputError(ValueError):
    """The find's request cannot be bisected (its range, or a gate it would run, is refused)."""


class FindRequest(BaseModel):
    """What to bisect: `gate` is the gate every step runs (its `head` the bad commit, its `base`
    the good one, with the suites, preset, parameters, device and backend as `gdnval gate` takes
    them); `commits` the first-parent commits after the good one up to the bad one."""

    model_config = ConfigDict(extra="forbid", strict=True)

    gate: GateRequest
    commits: list[str] = Field(
        default_factory=list, max_length=MAX_RANGE,
        description="first-parent commits after gate.base up to gate.head, oldest first (full shas); "
        "empty: the service lists them in the repository it knows (GDNVAL_REPO, or gate.backend_repo)",
    )
    run_id: str = Field("", max_length=32, pattern=r"^[0-9A-Za-z_-]*$",
                        description="the find run: its steps' gates are keyed by it (empty: derived)")

    @model_validator(mode="after")
    def _range(self) -> FindRequest:
        good, bad = self.gate.base, self.gate.head
        if good is None or parse_job_ref(good) is not None or self.gate.baseline is not None:
            raise ValueError(f"a find needs gate.base as the good commit, got base={good!r} "
                             f"baseline={self.gate.baseline!r}")
        if not self.gate.reuse:
            raise ValueError("a find reuses every stored job (gate.reuse true); only its boundary is "
                             "measured anew")
        if self.commits:
            if self.commits[-1] != bad:
                raise ValueError(f"commits end with {self.commits[-1]!r}, expected the bad commit {bad!r}")
            if good in self.commits or len(set(self.commits)) != len(self.commits):
                raise ValueError("commits must list each commit after the good one once, the good one not")
        return self

    @field_validator("commits")
    @classmethod
    def _commits(cls, v: list[str]) -> list[str]:
        return [check_commit(c, "commits[]") for c in v]

    def key(self) -> str:
        """The run id, or a stable hash of the request."""
        if self.run_id:
            return self.run_id
        blob = json.dumps(self.model_dump(exclude={"run_id"}), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def step_gate(self, kind: StepKind, head: str, base: str) -> GateRequest:
        """The gate of one step: `head` against `base`; the confirmation measures both anew."""
        run = f"find:{self.key()}:{kind[0]}:{head[:12]}"
        return self.gate.model_copy(update={"head": head, "base": base, "run_id": run,
                                            "reuse": kind != "confirm"})


@dataclass
class FindState:
    phase: Literal["waiting", "done"]
    exit_code: int | None
    verdict: Literal["pass", "fail", "error"] | None
    reason: str
    good: str
    bad: str
    commits: list[str]
    steps: list[FindStep] = field(default_factory=list)
    first_bad: str | None = None
    last_good: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)  # what moved at the boundary
    measured: list[str] = field(default_factory=list)  # commits whose jobs the find ran
    jobs: list[GateJob] = field(default_factory=list)  # the running step's jobs
    find_id: int | None = None

    @property
    def bound(self) -> int:
        return measured_bound(len(self.commits))

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase, "exit_code": self.exit_code, "verdict": self.verdict, "reason": self.reason,
            "good": self.good, "bad": self.bad, "commits": list(self.commits), "first_bad": self.first_bad,
            "last_good": self.last_good, "findings": list(self.findings), "measured": list(self.measured),
            "bound": self.bound, "steps": to_jsonable(self.steps), "jobs": to_jsonable(self.jobs),
            "find_id": self.find_id,
        }


def commit_range(req: FindRequest) -> list[str]:
    """The request's commits, or the first-parent range the service's repository lists."""
    if req.commits:
        return list(req.commits)
    try:
        repo = backend_repository(req.gate.backend_repo) if req.gate.backend_repo else service_repository()
        if repo is None:
            raise FindInputError("give the commits to bisect: the service knows no repository (GDNVAL_REPO)")
        commits = first_parent(repo, req.gate.head, since=req.gate.base, limit=MAX_RANGE)
    except (RangeError, ValueError) as exc:
        raise FindInputError(str(exc)) from exc
    if not commits:
        raise FindInputError(f"no commit after {req.gate.base} up to {req.gate.head}")
    return commits


def evaluate_find(engine: Any, req: FindRequest, submit: SubmitFn | None = None) -> FindState:
    """One step of the find: run (or read) the step gates it needs now, record each finished
    step, and store where the find stands."""
    commits = commit_range(req)
    good = str(req.gate.base)
    with Session(engine) as s:
        steps = find_store.steps_of_run(s, req.key())
    state = FindState("waiting", None, None, "", good, req.gate.head, commits, steps)
    while True:
        outcomes: dict[str, Outcome] = {st.commit: st.outcome for st in steps  # type: ignore[misc]
                                        if st.kind != "confirm" and st.outcome is not None}
        confirmed = next((st.outcome for st in steps if st.kind == "confirm" and st.outcome), None)
        nxt = next_step(good, commits, outcomes, confirmed)  # type: ignore[arg-type]
        if nxt.kind == "done":
            _finish(engine, state, nxt)
            break
        try:
            gate = evaluate_gate(engine, req.step_gate(nxt.kind, str(nxt.commit), str(nxt.base)), submit)
        except GateInputError as exc:
            raise FindInputError(f"the gate of {str(nxt.commit)[:12]}: {exc}") from exc
        step = _record(steps, nxt, gate)
        if gate.phase == "waiting":
            state.jobs, state.reason = gate.jobs, f"{step.kind} {step.commit[:12]}: {gate.reason}"
            break
    with Session(engine) as s:
        state.measured = find_store.measured_commits(s, [st.gate_id for st in steps])
    state.find_id = _save(engine, req, state)
    return state


def _record(steps: list[FindStep], nxt: Next, gate: Any) -> FindStep:
    """The step of `nxt`'s gate, added or updated in place: its outcome once the gate is done."""
    outcome = OUTCOME_OF_EXIT.get(gate.exit_code) if gate.phase == "done" else None
    reason = gate.reason if gate.phase == "done" else ""
    for i, st in enumerate(steps):
        if st.kind == nxt.kind and st.commit == nxt.commit:
            steps[i] = FindStep(st.position, st.kind, st.commit, gate.gate_id, outcome, reason)
            return steps[i]
    steps.append(FindStep(len(steps), str(nxt.kind), str(nxt.commit), gate.gate_id, outcome, reason))
    return steps[-1]


def _finish(engine: Any, state: FindState, nxt: Next) -> None:
    state.phase, state.exit_code, state.verdict, state.reason = "done", nxt.code, nxt.verdict, nxt.reason
    state.first_bad, state.last_good = nxt.first_bad, nxt.last_good
    confirm = next((st for st in state.steps if st.kind == "confirm"), None)
    if nxt.first_bad is not None and confirm is not None:  # what moved: the boundary gate's regressions
        with Session(engine) as s:
            found = find_store.gate_findings(s, confirm.gate_id)
        state.findings = [f for f in found if f.get("change") == "regression"]


def _save(engine: Any, req: FindRequest, state: FindState) -> int:
    fields = {
        "head": state.bad, "base": state.good, "backend": req.gate.backend,
        "backend_repo": req.gate.backend_repo, "device": req.gate.device, "world_size": req.gate.world_size,
        "commits": list(state.commits),
        "phase": state.phase, "verdict": state.verdict, "exit_code": state.exit_code,
        "reason": state.reason[:10_000], "first_bad": state.first_bad, "last_good": state.last_good,
        "findings": state.findings, "measured": state.measured,
    }
    return find_store.save_find(engine, req.key(), req.model_dump(mode="json"), fields, state.steps)
