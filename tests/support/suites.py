"""Test-only suites for the runtime and executor tests; registered by the tests that use them.

`probe`: a few cheap cases that exercise the runtime's contract (bounds, expected errors, errors,
collectives on the job's group) and, through the `fault` parameter, a rank that raises, kills
itself, kills its parent (a Ray actor) or hangs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from workers.context import RankContext
from workers.executors.base import Executor
from workers.registry import SUITE_MODULES
from workers.suite import Case, Metric, Sample, Suite, SuiteParams

MARKER = 1.0  # the commit-snapshot test rewrites this constant in a temporary repository


class ProbeParams(SuiteParams):
    fault: str = "none"  # none | raise | kill | kill_parent | hang | case_error | not_implemented
    fault_rank: int = 1
    repeats: int = 3
    bound_violation: bool = False
    pause_s: float = 0.0  # how long the `bounded` case sleeps first (a job that runs a while)
    # with a path, the `bounded` case sleeps only while that file exists (still at most pause_s):
    # a test holds a job mid-run exactly as long as it needs, and a re-run of it goes straight on
    hold_file: str = ""
    scratch: bool = False  # `collective` makes a temporary folder and prints its path


class ProbeSuite(Suite):
    name = "probe"
    description = "runtime/executor probe (tests only)"
    params_model = ProbeParams
    presets: ClassVar = {"quick": {}, "gate": {"repeats": 5}, "full": {"repeats": 10}}
    metrics = (
        Metric("allreduce_sum", "count", "check", direction="higher", bound=0.0),
        Metric("value", "unit", "accuracy", direction="lower", bound=1.0),
        Metric("marker", "unit", "check", direction="higher"),
    )

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, ProbeParams)
        p = params.model_dump()
        return [
            Case(self.name, "collective", p),
            Case(self.name, "bounded", p),
            Case(self.name, "expects_value_error", p, expected_error="ValueError"),
            Case(self.name, "fault", p),
            Case(self.name, "after_fault", p),
        ]

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        import torch
        import torch.distributed as dist

        p = case.params
        if case.name == "collective":
            for i in range(int(p["repeats"])):
                t = torch.tensor([float(ctx.rank + 1)])
                if ctx.distributed:
                    dist.all_reduce(t, group=ctx.group)
                yield Sample(case.name, "allreduce_sum", float(t.item()), rank=ctx.rank, idx=i)
            yield Sample(case.name, "marker", MARKER, rank=ctx.rank)
            if ctx.rank == 0 and ctx.artifacts_dir is not None:
                (ctx.artifacts_dir / "note.txt").write_text(f"world {ctx.world_size}")
            print(f"probe output from rank {ctx.rank}", flush=True)
            if p["scratch"]:
                import tempfile

                print(f"scratch {tempfile.mkdtemp(prefix='gdnval-probe-')}", flush=True)
        elif case.name == "bounded":
            _pause(float(p["pause_s"]), p.get("hold_file", ""))
            value = 2.0 if p["bound_violation"] else 0.5
            yield Sample(case.name, "value", value, rank=ctx.rank)
        elif case.name == "expects_value_error":
            raise ValueError("raised on purpose")
        elif case.name == "fault" and ctx.rank == int(p["fault_rank"]) % ctx.world_size:
            fault = p["fault"]
            if fault in ("raise", "case_error"):
                raise RuntimeError(f"probe fault on rank {ctx.rank}")
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "kill_parent":
                os.kill(os.getppid(), signal.SIGKILL)
                time.sleep(60)
            if fault == "hang":
                time.sleep(3600)
        elif case.name == "fault" and p["fault"] == "case_error":
            raise RuntimeError(f"probe fault on rank {ctx.rank}")  # every rank: a recorded case error
        elif case.name == "fault" and p["fault"] == "not_implemented":
            raise NotImplementedError("the probe takes no cu_seqlens")  # every rank: not applicable
        elif case.name == "fault" and p["fault"] == "raise" and ctx.distributed:  # never received
            dist.isend(torch.tensor([7.0]), dst=int(p["fault_rank"]) % ctx.world_size, group=ctx.group)
        elif case.name == "after_fault":
            yield Sample(case.name, "value", 0.0, rank=ctx.rank)
            if ctx.distributed:  # the group is in step again: every rank's contribution arrives
                t = torch.tensor([float(ctx.rank + 1)])
                dist.all_reduce(t, group=ctx.group)
                yield Sample(case.name, "allreduce_sum", float(t.item()), rank=ctx.rank)



def _pause(seconds: float, hold_file: str) -> None:
    """Sleep `seconds`; with `hold_file`, only while that file exists (at most `seconds`)."""
    if not hold_file:
        time.sleep(seconds)
        return
    end = time.monotonic() + seconds
    while Path(hold_file).exists() and time.monotonic() < end:
        time.sleep(0.1)


SUITE = ProbeSuite()


def make_ray_executor() -> Executor:
    """The service's Ray executor with `probe` registered (named by `GDNVAL_EXECUTOR` in the
    tests that serve Ray jobs from a server process); the address or the driver listener from
    `GDNVAL_RAY_ADDRESS` / `GDNVAL_RAY_DRIVER`."""
    from workers import registry
    from workers.executors import make_executor

    registry.SUITE_MODULES.setdefault(SUITE.name, __name__)
    return make_executor("ray", address=os.environ.get("GDNVAL_RAY_ADDRESS"),
                         driver=os.environ.get("GDNVAL_RAY_DRIVER"))


# --------------------------------------------------------------------------- shared test helpers


class RecordingSink:
    """A JobSink that keeps everything (thread-safe enough for the executors' single reader)."""

    def __init__(self, cancel_after_case: str | None = None) -> None:
        self.cancel = threading.Event()  # set once `cancel_after_case` has a result
        self._cancel_after = cancel_after_case
        self.samples_: list[Sample] = []
        self.cases: dict[str, tuple[str, str | None]] = {}
        self.infos: list[dict] = []
        self.logs: list[str] = []
        self.progress_: list[tuple[int, int, str]] = []
        self.waits: list[str | None] = []  # what the job waited for; None once its ranks started
        self.artifacts: list[tuple[str, str, bytes]] = []

    def samples(self, batch: Sequence[Sample]) -> None:
        self.samples_.extend(batch)

    def case_result(self, case: str, status: str, error: str | None = None) -> None:
        self.cases[case] = (status, error)
        if case == self._cancel_after:
            self.cancel.set()

    def progress(self, done: int, total: int, message: str = "") -> None:
        self.progress_.append((done, total, message))

    def info(self, info: dict) -> None:
        self.infos.append(dict(info))

    def log(self, line: str) -> None:
        self.logs.append(line)

    def waiting(self, reason: str | None) -> None:
        self.waits.append(reason)

    def artifact(self, name: str, media_type: str, data: bytes) -> None:
        self.artifacts.append((name, media_type, data))

    def values(self, case: str, metric: str) -> dict[int, list[float]]:
        """rank -> values of one metric of one case."""
        out: dict[int, list[float]] = {}
        for s in self.samples_:
            if s.case == case and s.metric == metric:
                out.setdefault(s.rank, []).append(s.value)
        return out


def make_marker_repo(root: Path) -> tuple[Path, list[str]]:
    """A git repository holding this project's packages, committed twice: MARKER = 1.0, then 2.0.

    A job for either commit must report that commit's MARKER (the code under test is the commit).
    """
    import subprocess

    from tests.support.repos import copy_runtime  # here: the snapshot holds this module alone

    repo = root / "repo"
    module_file = copy_runtime(repo, Path(__file__).resolve())
    text = module_file.read_text()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e", *args],
            check=True, capture_output=True, text=True,
        ).stdout.strip()

    git("init", "-q")
    shas = []
    for marker in ("1.0", "2.0"):
        module = text.replace("MARKER = 1.0", f"MARKER = {marker}", 1)
        module_file.write_text(module)
        git("add", "-A")
        git("commit", "-qm", f"marker {marker}")
        shas.append(git("rev-parse", "HEAD"))
    return repo, shas


@contextmanager
def probe_registered() -> Iterator[None]:
    """`probe` in the suite registry for the block: executors and ranks look suites up by name."""
    SUITE_MODULES["probe"] = __name__
    try:
        yield
    finally:
        SUITE_MODULES.pop("probe", None)
