"""`gatetime`: a test-only suite whose timing is set by the code of the commit under test.

The gate tests copy the project into a temporary git repository and commit it twice, the second
time with `SLOW_FACTOR` rewritten; the executor runs each job on its commit's snapshot, so the
head really is slower. `GDNVAL_TEST_NOISE_FILE`: when that file exists, the next run deletes it
and is slow once (a one-off noisy run that `--confirm` must not count).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from workers.context import RankContext
from workers.suite import Case, Metric, Sample, Suite, SuiteParams

SLOW_FACTOR = 1.0  # rewritten by the gate tests in a temporary repository
NOISE_ENV = "GDNVAL_TEST_NOISE_FILE"
SUITE_MODULE = "tests.support.gate_suite"


class GateTimeParams(SuiteParams):
    # 80 ms sleeps: a busy shared CPU delays wake-ups by a few ms, which must stay well under the
    # 5% minimum effect so that the unchanged pair never "regresses"
    repeats: int = 10
    base_ms: float = 80.0


class GateTimeSuite(Suite):
    name = "gatetime"
    description = "sleep-timed case whose duration is a constant of the commit (tests only)"
    params_model = GateTimeParams
    presets: ClassVar = {"quick": {"repeats": 8}, "gate": {}, "full": {"repeats": 20}}
    metrics = (
        # a sleep is not slowed by a busy CPU's lower throughput, only its wake-up is delayed by a
        # few ms: it declares the 5 % a GPU timing has instead of the cpu default (a doubling)
        Metric("sleep_ms", "ms", "time", min_effect=0.05, description="one timed sleep"),
        Metric("err", "", "accuracy", bound=1e-2, description="a constant error"),
    )

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, GateTimeParams)
        return [Case(self.name, "sleep", params.model_dump())]

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        factor = SLOW_FACTOR
        flag = os.environ.get(NOISE_ENV)
        if flag and os.path.exists(flag):
            os.remove(flag)
            factor *= 1.6  # this run only
        seconds = float(case.params["base_ms"]) * factor / 1000.0
        for i in range(int(case.params["repeats"])):
            t0 = time.perf_counter()
            time.sleep(seconds)
            yield Sample(case.name, "sleep_ms", (time.perf_counter() - t0) * 1000.0, rank=ctx.rank, idx=i)
        yield Sample(case.name, "err", 1e-4, rank=ctx.rank)


SUITE = GateTimeSuite()


def git(repo: Path, *args: str) -> str:
    """`git -C repo ARGS` with a fixed identity; its stdout, stripped."""
    out = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=gate@example.com", "-c", "user.name=gate", *args],
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


def make_repo(path: Path) -> dict[str, str]:
    """The runtime's code (gdn, kernels, workers) and this suite, committed four times:
    A; B (timing unchanged); C (`SLOW_FACTOR` 1.5: a planted slow-down); D (timing as B)."""
    from tests.support.repos import copy_runtime  # here: the snapshot holds this module alone

    suite_file = copy_runtime(path, Path(__file__).resolve())
    src = suite_file.read_text()
    assert "SLOW_FACTOR = 1.0  #" in src
    git(path, "init", "-q")
    shas: dict[str, str] = {}

    def commit(name: str) -> None:
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", name)
        shas[name] = git(path, "rev-parse", "HEAD")

    commit("A")
    (path / "NOTES.txt").write_text("B: a change that does not touch timing\n")
    commit("B")
    suite_file.write_text(src.replace("SLOW_FACTOR = 1.0  #", "SLOW_FACTOR = 1.5  #"))
    commit("C")
    suite_file.write_text(src)
    commit("D")
    return shas


@contextlib.contextmanager
def serve_in_thread(settings: Any) -> Iterator[str]:
    """The real app (create_app with its dispatcher) under uvicorn in a thread on a free loopback
    port; yields its base URL and stops it on exit."""
    import uvicorn

    from service.app import create_app
    from tests.support.ports import free_port  # here: the snapshot holds this module alone

    port = free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(30)
