"""LocalExecutor: ranks as local processes; success, faults, cancel, and the job's commit."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.support.suites import RecordingSink, make_marker_repo, probe_registered
from tests.support.waiting import process_gone
from workers.executors.base import JobSpec
from workers.executors.local import LocalExecutor
from workers.runtime import rank_environment

pytestmark = pytest.mark.slow
DEADLINE_S = 10.0  # the hang test's deadline: ~2x the ~5 s the healthy ranks need on a busy machine


@pytest.fixture(scope="module", autouse=True)
def probe_suite():
    with probe_registered():
        yield


def _run(executor: LocalExecutor, cancel: threading.Event | None = None, **kw):
    sink = RecordingSink()
    suite = kw.pop("suite_", "probe")
    spec = JobSpec(job_id=1, suite=suite, deadline_s=kw.pop("deadline_s", 120.0), **kw)
    t0 = time.monotonic()
    outcome = executor.run(spec, sink, cancel or threading.Event())
    return outcome, sink, time.monotonic() - t0


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("kill", "rank 1 killed by SIGKILL during case 'fault'"),
        ("hang", f"job deadline of {DEADLINE_S:g} s exceeded: rank 1 in case 'fault'"),
    ],
)
def test_a_faulty_rank_fails_the_job_with_its_rank_and_reason(
    fault: str, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the ranks' scratch folders go
    seen: set[str] = set()
    running = threading.Event()
    running.set()

    def watch() -> None:
        while running.is_set():
            seen.update(p.name for p in tmp_path.glob("gdnval-rank*"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    deadline = DEADLINE_S if fault == "hang" else 60.0
    params = {"fault": fault, "repeats": 1}
    outcome, sink, elapsed = _run(LocalExecutor(), params=params, world_size=2, deadline_s=deadline)
    running.clear()
    watcher.join()
    assert {n.split("-")[1] for n in seen} == {"rank0", "rank1"}  # made by the executor, one per rank
    assert list(tmp_path.glob("gdnval-rank*")) == []  # and removed, though a rank was killed
    assert outcome.status == "failed"
    assert outcome.error.startswith("rank 1") and reason in outcome.error
    assert elapsed < (DEADLINE_S + 10 if fault == "hang" else 30)
    assert sink.cases["collective"][0] == "passed"  # cases before the fault were reported
    assert "after_fault" not in sink.cases
    pids = [r["pid"] for r in sink.infos[0]["ranks"]]
    assert len(pids) == 2 and all(process_gone(p) for p in pids)


@pytest.mark.parametrize(
    ("fault", "status", "error"),
    [
        ("raise", "error", "RuntimeError: probe fault on rank 1"),
        ("not_implemented", "skipped", "not applicable: NotImplementedError: the probe takes no cu_seqlens"),
    ],
)
def test_a_case_that_raises_stays_inside_its_case(fault: str, status: str, error: str) -> None:
    outcome, sink, _ = _run(LocalExecutor(), params={"fault": fault, "repeats": 1}, world_size=2)
    assert outcome.status == "succeeded", outcome.error
    got, text = sink.cases.pop("fault")
    assert got == status and error in text
    expected = ("expected_error", "rank 0: ValueError: raised on purpose")
    assert set(sink.cases.values()) <= {("passed", None), expected}  # every other case as usual
    assert sink.values("after_fault", "allreduce_sum") == {0: [3.0], 1: [3.0]}  # the group is in step


def test_a_backend_that_refuses_packed_input_leaves_the_later_cases_passing() -> None:
    """Rank 0 refuses the packed case while rank 1 waits for its transfer (until the transfer
    timeout): the case does not pass, and the cases after it run on a group in step."""
    backend = "tests.support.refusing_backend:no_packed"
    names = tuple(f"p2p_{backend}_{shape}" for shape in
                  ("T160_B1_packed4_float64", "T128_B1_float32", "T160_B2_valid151_float32"))
    params = {"candidates": [f"p2p+{backend}"], "transfer_timeout_s": 5.0}
    outcome, sink, _ = _run(LocalExecutor(), params=params, world_size=2, cases=names, suite_="cp-layer")
    assert outcome.status == "succeeded", outcome.error
    assert sink.cases[names[0]][0] in ("skipped", "error")
    assert {sink.cases[n] for n in names[1:]} == {("passed", None)}


def test_cancel_kills_the_ranks() -> None:
    sink = RecordingSink(cancel_after_case="expects_value_error")  # the next case hangs
    spec = JobSpec(1, "probe", params={"fault": "hang"}, world_size=2, deadline_s=120, deterministic=True)
    t0 = time.monotonic()
    outcome = LocalExecutor().run(spec, sink, sink.cancel)
    assert outcome.status == "cancelled"
    assert time.monotonic() - t0 < 60
    assert sink.infos[0]["deterministic"] is True  # the flags reached the ranks
    assert all(process_gone(r["pid"]) for r in sink.infos[0]["ranks"])


def test_two_rank_gloo_job_after_the_faults_streams_samples_per_rank() -> None:
    outcome, sink, _ = _run(LocalExecutor(), world_size=2, params={"repeats": 3})
    assert outcome.status == "succeeded", outcome.error
    assert sink.values("collective", "allreduce_sum") == {0: [3.0, 3.0, 3.0], 1: [3.0, 3.0, 3.0]}
    assert sink.cases == {
        "collective": ("passed", None),
        "bounded": ("passed", None),
        "expects_value_error": ("expected_error", "rank 0: ValueError: raised on purpose"),
        "fault": ("passed", None),
        "after_fault": ("passed", None),
    }
    assert sink.progress_[0] == (0, 5, "started") and sink.progress_[-1][:2] == (5, 5)
    assert sink.artifacts == [("rank0/note.txt", "text/plain", b"world 2")]
    assert "[rank 1] probe output from rank 1" in sink.logs  # rank output arrives as job log lines
    info = sink.infos[0]
    threads = int(os.environ.get("OMP_NUM_THREADS")
                  or rank_environment("cpu", world_size=2, base_env={}, prefixes=[])["OMP_NUM_THREADS"])
    assert info["deterministic"] is False and info["torch_threads"] == threads  # ranks share the cores
    assert info["world_size"] == 2 and [r["rank"] for r in info["ranks"]] == [0, 1]
    assert info["device_kind"] == "cpu" and info["torch"] and info["commit"]


def test_ranks_skip_the_cases_an_earlier_run_finished() -> None:
    done = ("collective", "bounded", "expects_value_error", "fault")
    outcome, sink, _ = _run(LocalExecutor(), params={"repeats": 1}, skip_cases=done)
    assert outcome.status == "succeeded", outcome.error
    assert sink.cases == {"after_fault": ("passed", None)}
    assert sink.progress_[0] == (0, 1, "started")


def test_bad_specs_fail_at_once_with_the_reason() -> None:
    ex = LocalExecutor(cpu_max_world_size=2)
    outcome, _, elapsed = _run(ex, world_size=3)
    assert outcome.status == "failed" and "world_size 3 exceeds the 2 cpu rank(s)" in outcome.error
    outcome, _, _ = _run(ex, device="tpu")
    assert outcome.status == "failed" and "unknown device kind 'tpu'" in outcome.error
    outcome, _, _ = _run(ex, preset="nightly")
    assert outcome.status == "failed" and "unknown preset 'nightly'" in outcome.error
    assert elapsed < 1


def test_cuda_rank_environment_turns_nvlink_multicast_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CUDA rank's environment has multicast off even when the executor's own environment
    asks for it; each rank sees only its own device, taken from the parent's visible list."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    spec = JobSpec(job_id=1, suite="probe", device="cuda", world_size=4)
    ex = LocalExecutor()
    for rank in range(4):
        env = ex.rank_env(spec, rank, Path("."), 29500, devices=[3, 2, 1, 0])
        assert env["NCCL_NVLS_ENABLE"] == "0"
        assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert env["NVSHMEM_DISABLE_NVLS"] == "1"
        assert env["CUDA_VISIBLE_DEVICES"] == str(7 - rank)
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "4")


def test_a_job_runs_the_code_of_its_commit(tmp_path: Path) -> None:
    repo, shas = make_marker_repo(tmp_path)
    ex = LocalExecutor(repo=repo, cache_dir=tmp_path / "cache")
    seen = {}
    for sha in shas:
        outcome, sink, _ = _run(ex, commit=sha[:12], params={"repeats": 1})
        assert outcome.status == "succeeded", outcome.error
        seen[sha] = sink.values("collective", "marker")[0]
        assert sink.infos[0]["commit"] == sha
        assert sink.infos[0]["source_root"] == str(tmp_path / "cache" / sha)
    assert seen == {shas[0]: [1.0], shas[1]: [2.0]}
