"""What a gate is asked: the request, its defaults per suite (preset, parameters, the suites
themselves) and the whole-request check run before any job is queued."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from service.domain import submission
from service.domain.backend_gate import BACKEND_SUITES, NeverCallsBackend, check_calls_backend, suite_params
from service.domain.baselines import parse_job_ref
from workers.refs import check_commit
from workers.registry import get_suite, suite_names
from workers.suite import UnknownSuiteInput


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



class GateInputError(ValueError):
    """The request names an unknown suite/preset/baseline or an impossible combination."""



def preset_for(req: GateRequest, suite: str) -> str:
    """The preset a suite is gated with: the request's, or the suite's gate preset for the device."""
    return req.preset or get_suite(suite).gate_presets.get(req.device, "gate")


def params_for(req: GateRequest, suite: str) -> dict[str, Any]:
    """The parameter overrides of a suite's jobs: the gated backend's, then the request's."""
    return suite_params(suite, req.backend, req.world_size, req.params)


def suites_for(req: GateRequest) -> list[str]:
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
    suites = suites_for(req)
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
