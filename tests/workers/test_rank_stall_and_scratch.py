"""No silent hangs, nothing left behind, on the local executor with real rank processes:

- a rank stopped with SIGSTOP beats no more: its job fails at the stall limit, long before its
  deadline, naming the rank, its pid and its case, and every rank is gone after;
- what a rank writes to temporary files lives in its own folder (its TMPDIR), removed with it;
- folders of ranks whose executor was killed (and a killed Ray driver's staging folders) are
  removed when an executor starts, and those of a live executor are kept.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.support.suites import RecordingSink, probe_registered
from tests.support.waiting import process_gone
from workers.executors.base import JobSpec
from workers.executors.local import LocalExecutor

pytestmark = pytest.mark.slow  # rank processes
STALL_S = 4.0


@pytest.fixture(autouse=True)
def probe_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the ranks' folders go
    with probe_registered():
        yield


def test_a_stopped_rank_ends_its_job_at_the_stall_limit() -> None:
    sink = RecordingSink()
    # rank 1 sleeps through `bounded` (still beating), then is stopped there
    spec = JobSpec(job_id=1, suite="probe", params={"repeats": 1, "pause_s": 120}, world_size=2,
                   deadline_s=600, stall_s=STALL_S)
    result: dict = {}
    executor, cancel = LocalExecutor(), threading.Event()
    thread = threading.Thread(target=lambda: result.update(outcome=executor.run(spec, sink, cancel)))
    thread.start()
    end = time.monotonic() + 60
    while "collective" not in sink.cases:
        assert time.monotonic() < end and thread.is_alive(), (sink.logs[-5:], result)
        time.sleep(0.1)
    time.sleep(STALL_S + 1)  # in `bounded`: sleeping, beating, not stalled
    assert thread.is_alive(), result
    pids = {r["rank"]: r["pid"] for r in sink.infos[0]["ranks"]}
    os.kill(pids[1], signal.SIGSTOP)
    stopped = time.monotonic()
    thread.join(30)
    outcome = result["outcome"]
    assert outcome.status == "failed", outcome
    assert outcome.error.startswith(f"rank 1 (pid {pids[1]}) made no progress for "), outcome.error
    assert f"(stall limit {STALL_S:g} s): its process is stopped or frozen during case 'bounded'" \
        in outcome.error
    assert time.monotonic() - stopped < STALL_S + 10
    assert all(process_gone(p) for p in pids.values())


def test_a_ranks_temporary_files_go_with_its_folder(tmp_path: Path) -> None:
    sink = RecordingSink()
    spec = JobSpec(job_id=1, suite="probe", params={"repeats": 1, "scratch": True}, deadline_s=120)
    outcome = LocalExecutor().run(spec, sink, threading.Event())
    assert outcome.status == "succeeded", outcome.error
    made = Path(next(line for line in sink.logs if "scratch " in line).split("scratch ", 1)[1])
    folder = made.parent.parent  # <rank folder>/tmp/gdnval-probe-...
    assert folder.parent == tmp_path and folder.name.startswith(f"gdnval-rank0-p{os.getpid()}-"), made
    assert not made.exists() and not folder.exists()
    assert list(tmp_path.iterdir()) == []


def test_folders_of_a_killed_executor_are_removed_when_an_executor_starts(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"gdnval-rank0-p{dead.pid}-abc123"
    staged = tmp_path / f"gdnval-ship-p{dead.pid}-ghi789"  # a Ray driver's staging, killed mid-ship
    live = tmp_path / f"gdnval-rank1-p{os.getpid()}-def456"
    for folder in (stale, staged, live):
        (folder / "tmp" / "gdnval-tokens-x").mkdir(parents=True)
        (folder / "tmp" / "gdnval-tokens-x" / "sample.bin").write_bytes(b"tokens")
    LocalExecutor()
    assert not stale.exists() and not staged.exists() and live.exists()
