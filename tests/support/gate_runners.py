"""Submit functions that "run" a `gatetime` job at once by writing its samples (known timings per
commit, no executor), and the store they run against: the gate, find and history tests judge
these jobs with the real compare engine on a real store, in seconds (the real executor path is
the e2e tests')."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from service.domain.gate import GateRequest, GateState, preset_for
from service.persistence import cases as case_store
from service.persistence import queue
from service.persistence import samples as sample_store
from service.persistence.models import JobRow
from tests.support.gate_suite import SUITE, SUITE_MODULE


@contextlib.contextmanager
def gatetime_store(url: str, mp: pytest.MonkeyPatch) -> Iterator[Any]:
    """An engine on a migrated store at `url`, with the `gatetime` suite registered through `mp`
    (undone with it) for as long as the block runs."""
    from service.persistence.db import make_engine, upgrade
    from workers.registry import SUITE_MODULES, get_suite

    mp.setitem(SUITE_MODULES, "gatetime", SUITE_MODULE)
    get_suite.cache_clear()
    engine = make_engine(url)
    upgrade(engine)
    try:
        yield engine
    finally:
        engine.dispose()
        get_suite.cache_clear()


def sleep_metric(state: GateState) -> Any:
    """The `sleep_ms` comparison of a one-suite gatetime gate."""
    (cmp,) = state.comparisons
    return next(m for c in cmp.cases for m in c.metrics if m.metric == "sleep_ms")


# FakeRunner's commits and how their jobs behave
A, B, C, D, E, X = ("a" * 40, "b" * 40, "c" * 40, "d" * 40, "e" * 40, "f" * 40)
N, NB, R = "1" * 40, "3" * 40, "2" * 40
U, UB = "4" * 40, "5" * 40
F = "6" * 40
SLOW = {C, N, U}
FAST = {F}  # 0.7x: a real speed-up
NOISY_ONCE = {D}
BROKEN = {X}
NOISY = {N, NB}  # 30% noise: a 30% slow-down is not significant from one job of each side
ERRORS = {R}  # the case raises
LOADED_ON_CONFIRM = {U, UB}  # 30% noise in the confirmation pair (and its rounds) only


class FakeRunner:
    """A submit function: queues the job like the API, then "runs" it at once."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.submitted: list[int] = []
        self.runs: dict[str, int] = {}
        self.run_now = True

    def __call__(self, **kw: Any) -> int:
        job, _ = queue.submit(self.engine, queue.JobRequest(**kw))
        self.submitted.append(job.id)
        if self.run_now:
            self.run(job.id)
        return job.id

    def run(self, job_id: int) -> None:
        with Session(self.engine) as s, s.begin():
            job = s.get(JobRow, job_id)
            sha = job.code_commit
            role = (job.labels or {}).get("role", "")
            n = self.runs[sha] = self.runs.get(sha, 0) + 1
            if sha in BROKEN:
                job.status, job.error = "failed", "rank 0 died: killed by SIGKILL (out of memory?)"
                return
            params = SUITE.resolve_params(job.preset, job.params)
            (case,) = SUITE.cases(params)
            mids = sample_store.ensure_metrics(s, SUITE.name, SUITE.metrics)
            cid = case_store.ensure_cases(s, [case], job.device, job.world_size)[case.name]
            case_store.set_case_result(s, job_id, cid, "error" if sha in ERRORS else "passed",
                                  "Traceback: boom" if sha in ERRORS else None)
            job.status = "succeeded"
        factor = 1.3 if sha in SLOW or (sha in NOISY_ONCE and n == 1) else 0.7 if sha in FAST else 1.0
        loaded = sha in LOADED_ON_CONFIRM and role.startswith("confirm")
        noise = 0.3 if sha in NOISY or loaded else 0.01
        rng = np.random.default_rng(job_id)
        rows = [(cid, mids["sleep_ms"], 0, i, 80.0 * factor * (1 + noise * rng.standard_normal()))
                for i in range(params.repeats)]
        rows.append((cid, mids["err"], 0, 0, 1e-4))
        sample_store.insert_samples(self.engine, job_id, rows)


# TimedRunner's gate setting: a job of it is one a gate reuses
GATE = GateRequest(head="0" * 40, suites=["gatetime"], confirm=False, max_rounds=0)


class TimedRunner:
    """A submit function: queues the job like the API, then (unless `hold`) "runs" it at once:
    the sleep timings `factor[commit]` times the base (1 % noise, seeded by the job id); a job of
    a `broken` commit fails as a job (its code cannot be built)."""

    def __init__(self, engine: Any, factor: dict[str, float], broken: frozenset[str] = frozenset()) -> None:
        self.engine, self.factor, self.broken = engine, factor, broken
        self.submitted: list[int] = []
        self.hold = False

    def __call__(self, **kw: Any) -> int:
        job, _ = queue.submit(self.engine, queue.JobRequest(**kw))
        self.submitted.append(job.id)
        if not self.hold:
            self.run(job.id)
        return job.id

    def run(self, job_id: int) -> None:
        with Session(self.engine) as s, s.begin():
            row = s.get(JobRow, job_id)
            sha, row.attempts = row.code_commit, 1
            if sha in self.broken:
                row.status, row.error = "failed", "the backend could not be built: no such module"
                return
            params = SUITE.resolve_params(row.preset, row.params)
            (case,) = SUITE.cases(params)
            mids = sample_store.ensure_metrics(s, SUITE.name, SUITE.metrics)
            cid = case_store.ensure_cases(s, [case], row.device, row.world_size)[case.name]
            case_store.set_case_result(s, job_id, cid, "passed", None)
            row.status = "succeeded"
        rng = np.random.default_rng(job_id)
        ms = 80.0 * self.factor.get(sha, 1.0)
        rows = [(cid, mids["sleep_ms"], 0, i, ms * (1 + 0.01 * rng.standard_normal()))
                for i in range(params.repeats)]
        rows.append((cid, mids["err"], 0, 0, 1e-4))
        sample_store.insert_samples(self.engine, job_id, rows)

    def job(self, commit: str, **labels: str) -> int:
        """A job of `commit` in the gate's setting (so a gate reuses it)."""
        return self(suite="gatetime", preset=preset_for(GATE, "gatetime"), params={}, commit=commit,
                    device="cpu", world_size=1, labels=labels)
