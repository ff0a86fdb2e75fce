"""Test doubles and the server harness shared by the store, queue and API tests (no tests here).

`SUITE` ("fake-store") is a torch-free suite whose parameters steer `FakeExecutor`: how many
cases, samples per case and ranks, the pause between sample batches (to catch a job mid-run),
and whether the run fails. `make_executor` (named by `GDNVAL_EXECUTOR=tests.support.api_support:
make_executor`) routes fake-store jobs to `FakeExecutor` and every other suite to the real local
executor, so one server runs both the fake jobs and real quick suites.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import ROOT
from tests.support.ports import free_port
from workers import registry
from workers.executors.base import Executor, JobOutcome, JobSink, JobSpec
from workers.suite import Case, Metric, Sample, Suite, SuiteParams

FAKE = "fake-store"


class FakeParams(SuiteParams):
    cases: int = 2
    samples: int = 10  # idx values per case and metric
    ranks: int = 1
    batch: int = 0  # samples per sink call (0: one call per case)
    pause_s: float = 0.0  # sleep after each sink call
    fail: bool = False
    artifact: bool = False
    linger_s: float = 0.0  # wait after the last case before the job ends


class FakeSuite(Suite):
    name = FAKE
    description = "test double: deterministic samples, steerable timing"
    params_model = FakeParams
    presets = {"quick": {}, "slow": {"cases": 3, "samples": 400, "batch": 50, "pause_s": 0.05}}  # noqa: RUF012
    metrics = (
        Metric("time_ms", "ms", "time", "lower"),
        Metric("throughput", "tok/s", "time", "higher", bound=1.0),
    )
    devices = ("cpu", "cuda", "npu")

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, FakeParams)
        return [Case(FAKE, f"c{i}", {"i": i, "samples": params.samples}) for i in range(params.cases)]

    def run(self, ctx: Any, case: Case) -> Iterator[Sample]:  # never called: FakeExecutor emits
        raise NotImplementedError


SUITE = FakeSuite()
registry.SUITE_MODULES.setdefault(FAKE, __name__)


def value(case_i: int, metric: str, rank: int, idx: int) -> float:
    """The deterministic value FakeExecutor reports (tests recompute expectations from it)."""
    base = 10.0 * (case_i + 1) + idx
    return base + rank if metric == "time_ms" else 100.0 - idx - rank


class FakeExecutor(Executor):
    kind = "fake"

    def max_world_size(self, device: str) -> int:
        return 8 if device == "cpu" else 0

    def run(self, spec: JobSpec, sink: JobSink, cancel: threading.Event) -> JobOutcome:
        p = SUITE.resolve_params(spec.preset, spec.params)
        assert isinstance(p, FakeParams)
        sink.info({"device_name": "fake-cpu", "driver": None, "torch": "n/a", "triton": "n/a"})
        every = SUITE.cases(p)
        cases = [c for c in every if c.name not in spec.skip_cases]  # as the rank runtime does
        for done, case in enumerate(cases):
            ci = every.index(case)
            rows = [
                Sample(case.name, m, value(ci, m, r, i), rank=r, idx=i)
                for m in ("time_ms", "throughput")
                for i in range(p.samples)
                for r in range(p.ranks)
            ]
            step = p.batch or len(rows)
            for start in range(0, len(rows), step):
                if cancel.is_set():
                    return JobOutcome("cancelled")
                sink.samples(rows[start : start + step])
                if p.pause_s:
                    time.sleep(p.pause_s)
            sink.case_result(case.name, "passed")
            sink.progress(done + 1, len(cases), case.name)
            sink.log(f"{case.name} done")
        if p.linger_s and cancel.wait(p.linger_s):  # every case stored, the job not yet ended
            return JobOutcome("cancelled")
        if p.artifact:
            sink.artifact("report.txt", "text/plain", b"fake report\n")
        if p.fail:
            return JobOutcome("failed", "rank 0: asked to fail")
        return JobOutcome("succeeded")


class RoutingExecutor(Executor):
    """fake-store jobs to FakeExecutor, everything else to the real local executor."""

    kind = "local+fake"

    def __init__(self) -> None:
        from workers.executors import make_executor

        self.fake = FakeExecutor()
        self.local = make_executor("local")

    def max_world_size(self, device: str) -> int:
        return max(self.fake.max_world_size(device), self.local.max_world_size(device))

    def run(self, spec: JobSpec, sink: JobSink, cancel: threading.Event) -> JobOutcome:
        target = self.fake if spec.suite == FAKE else self.local
        return target.run(spec, sink, cancel)

    def close(self) -> None:
        self.local.close()


def make_executor() -> Executor:
    return RoutingExecutor()


def make_fake_executor() -> Executor:
    return FakeExecutor()


def make_job_python_executor() -> Executor:
    """The real local executor with job code run by `GDNVAL_TEST_JOB_PYTHON`: an interpreter every
    user may run (a machine's own may live where only root can reach it)."""
    from workers.executors.local import LocalExecutor

    return LocalExecutor(python=os.environ["GDNVAL_TEST_JOB_PYTHON"])


# ------------------------------------------------------------------------------ server harness

TOKEN = "test-token"


@dataclass
class Server:
    """A `gdnval serve` subprocess on a loopback port over a SQLite file."""

    workdir: Path
    db_url: str
    env: dict[str, str]
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    prefix: tuple[str, ...] = ()  # a command the server runs under (`unshare ...`)
    python: str = sys.executable  # the server's interpreter

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Server:
        import httpx

        self.port = free_port()
        log = open(self.workdir / f"server-{self.port}.log", "wb")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(
            [*self.prefix, self.python, "-m", "service.cli", "serve", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_text()}")
            try:
                if httpx.get(f"{self.base}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {timeout} s: {self.log_text()}")

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in self.workdir.glob("server-*.log"))

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def make_server(workdir: Path, executor: str = "tests.support.api_support:make_executor",
                **env: str) -> Server:
    db_url = env.pop("GDNVAL_DB_URL", None) or f"sqlite:///{workdir / 'gdnval.db'}"
    full = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "GDNVAL_DB_URL": db_url,
        "GDNVAL_API_TOKEN": TOKEN,
        "GDNVAL_EXECUTOR": executor,
        "GDNVAL_ARTIFACTS_DIR": str(workdir / "artifacts"),
        "GDNVAL_POLL_INTERVAL_S": "0.1",
        **env,
    }
    return Server(workdir=workdir, db_url=db_url, env=full)
