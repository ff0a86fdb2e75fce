"""Rank runtime pieces in-process: environment, case verdicts, rank combination, failure choice,
snapshots, the executor factory and the run summary (no rank processes here: see the executor tests)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from service.cli.run import summarise
from workers.context import RankContext
from workers.executors import make_executor
from workers.executors._monitor import JobMonitor, combine_case_statuses
from workers.executors.base import JobSpec
from workers.runtime import CaseOutcome, env_libstdcxx_dir, rank_environment, run_case
from workers.snapshot import COMMIT_FILE, SnapshotCache, SnapshotError
from workers.suite import Case, Metric, Sample, Suite, SuiteParams

# --------------------------------------------------------------------------- environment


def test_env_libstdcxx_goes_first_once(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libstdc++.so.6").write_bytes(b"")
    lib = str(tmp_path / "lib")
    env = rank_environment("cuda", base_env={"LD_LIBRARY_PATH": f"/usr/lib:{lib}"}, prefixes=[str(tmp_path)])
    assert env["LD_LIBRARY_PATH"] == f"{lib}:/usr/lib"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env_libstdcxx_dir([str(tmp_path / "nothing")]) is None
    assert env_libstdcxx_dir(["/usr", "/"]) is None  # never the system's
    assert "LD_LIBRARY_PATH" not in rank_environment("cpu", base_env={}, prefixes=[str(tmp_path / "x")])


def test_deterministic_and_cpu_thread_variables() -> None:
    env = rank_environment("cpu", deterministic=True, world_size=2, base_env={}, prefixes=[], cpu_count=8)
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["HCCL_DETERMINISTIC"] == "true"
    assert env["OMP_NUM_THREADS"] == "3"  # (8 cores - 1 for the service) // 2 ranks
    assert env["TRITON_INTERPRET"] == "1"  # the only way Triton runs on a CPU rank
    plain = rank_environment("cpu", base_env={"OMP_NUM_THREADS": "3", "TRITON_INTERPRET": "0"}, prefixes=[])
    assert "CUBLAS_WORKSPACE_CONFIG" not in plain and "OMP_NUM_THREADS" not in plain
    assert "TRITON_INTERPRET" not in plain and "TRITON_INTERPRET" not in rank_environment("cuda", base_env={})
    # cuBLAS reads its workspace setting once: every CUDA rank gets it, unless the caller set one
    assert rank_environment("cuda", base_env={})["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    preset = rank_environment("cuda", base_env={"CUBLAS_WORKSPACE_CONFIG": ":16:8"})
    assert "CUBLAS_WORKSPACE_CONFIG" not in preset


def test_cuda_ranks_keep_nvlink_multicast_off_whatever_the_caller_set() -> None:
    off = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    on = {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "NVSHMEM_DISABLE_NVLS": "0"}
    for base in ({}, on):
        env = rank_environment("cuda", base_env=base, prefixes=[])
        assert {k: env[k] for k in off} == off
        det = rank_environment("cuda", deterministic=True, world_size=8, base_env=base, prefixes=[])
        assert {k: det[k] for k in off} == off
    assert not set(off) & set(rank_environment("cpu", base_env={}, prefixes=[]))


# --------------------------------------------------------------------------- case verdicts


class _Params(SuiteParams):
    pass


class _VerdictSuite(Suite):
    name = "verdicts"
    description = "in-process verdict cases"
    params_model = _Params
    presets: ClassVar = {"quick": {}}
    metrics = (
        Metric("err", "abs", "accuracy", "lower", bound=1e-2),
        Metric("speedup", "x", "time", "higher", bound=2.0),
    )

    def cases(self, params: SuiteParams) -> list[Case]:
        return []

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        kind = case.params["kind"]
        if kind == "good":
            yield Sample(case.name, "err", 1e-3)  # rank left at the default: the runtime stamps it
            yield Sample(case.name, "speedup", 3.0, idx=1)
        elif kind == "bad":
            yield Sample(case.name, "err", 5e-2)
            yield Sample(case.name, "speedup", float("nan"))
        elif kind == "raise_lookup":
            yield Sample(case.name, "err", 0.0)
            raise KeyError("missing")
        elif kind == "undeclared":
            yield Sample(case.name, "nope", 0.0)


class _Buffer:
    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def add(self, s: Sample) -> None:
        self.samples.append(s)

    def flush(self) -> None:
        pass


def _verdict(kind: str, expected_error: str | None = None) -> tuple[CaseOutcome, list[Sample]]:
    ctx = RankContext(rank=3, world_size=4, device="cpu", device_kind="cpu")  # type: ignore[arg-type]
    buf = _Buffer()
    out = run_case(_VerdictSuite(), ctx, Case("verdicts", "c", {"kind": kind}, expected_error), buf)  # type: ignore[arg-type]
    return out, buf.samples


def test_case_runs_and_samples_are_stamped_with_the_rank() -> None:
    out, samples = _verdict("good")
    assert (out.status, out.error, out.raised) == ("passed", None, False)
    assert [s.rank for s in samples] == [3, 3]
    bad, _ = _verdict("bad")  # bounds are not judged on one rank: the monitor sees every rank
    assert bad.status == "passed"


def _metric_defs() -> list[dict[str, Any]]:
    return [m.to_dict() for m in _VerdictSuite.metrics]


def test_monitor_judges_bounds_over_every_rank_and_names_the_failure() -> None:
    sink = _NullSink()
    mon = JobMonitor(JobSpec(1, "verdicts", world_size=2), sink)  # type: ignore[arg-type]
    for r in (0, 1):  # every rank's info carries its code's metric definitions
        mon.handle(r, {"t": "info", "info": {"host": "h", "metrics": _metric_defs()}})
    info = next(a[0] for name, a in sink.calls if name == "info")
    assert [m["name"] for m in info["metrics"]] == ["err", "speedup"] and "metrics" not in info["ranks"][0]
    mon.handle(0, {"t": "cases", "total": 2, "names": ["ok", "bad"]})
    # case "ok": every rank within the bound (err judged on its worst value, speedup on the median)
    mon.handle(0, {"t": "samples", "samples": [["ok", "err", 1e-3, 0, 0], ["ok", "speedup", 3.0, 0, 0]]})
    mon.handle(1, {"t": "samples", "samples": [["ok", "err", 2e-3, 1, 0], ["ok", "speedup", 2.5, 1, 0]]})
    for r in (0, 1):
        mon.handle(r, {"t": "case_end", "case": "ok", "status": "passed", "error": None})
    # case "bad": rank 1's accuracy breaks the bound, rank 0's speedup is NaN
    nan = float("nan")
    mon.handle(0, {"t": "samples", "samples": [["bad", "err", 1e-3, 0, 0], ["bad", "speedup", nan, 0, 0]]})
    mon.handle(1, {"t": "samples", "samples": [["bad", "err", 5e-2, 1, 0], ["bad", "speedup", 3.0, 1, 0]]})
    for r in (0, 1):
        mon.handle(r, {"t": "case_end", "case": "bad", "status": "passed", "error": None})
    results = {a[0]: a[1:] for name, a in sink.calls if name == "case_result"}
    assert results["ok"] == ("passed", None)
    status, error = results["bad"]
    assert status == "failed"
    assert "err worst 0.05 breaks bound <= 0.01" in error
    assert "speedup has 1 non-finite of 1 value(s)" in error


def test_expected_error_matches_the_class_or_a_base_class() -> None:
    assert _verdict("raise_lookup", "KeyError")[0].status == "expected_error"
    assert _verdict("raise_lookup", "LookupError")[0].status == "expected_error"
    other = _verdict("raise_lookup", "ValueError")[0]
    assert other.status == "error" and "KeyError" in other.error and other.raised
    missing = _verdict("good", "ValueError")[0]
    assert missing.status == "failed" and "expected ValueError" in missing.error


def test_unexpected_exception_and_undeclared_metric_are_errors() -> None:
    out, samples = _verdict("raise_lookup")
    assert out.status == "error" and "KeyError: 'missing'" in out.error
    assert len(samples) == 1  # samples before the raise are kept
    out, _ = _verdict("undeclared")
    assert out.status == "error" and "declares no metric 'nope'" in out.error


# --------------------------------------------------------------------------- ranks combined


def test_worst_rank_wins_and_names_itself() -> None:
    assert combine_case_statuses({0: ("passed", None), 1: ("passed", None)}) == ("passed", None)
    assert combine_case_statuses({0: ("passed", None), 1: ("failed", "x too big")}) == (
        "failed",
        "rank 1: x too big",
    )
    assert combine_case_statuses({0: ("failed", "a"), 1: ("error", "tb")})[0] == "error"
    status, err = combine_case_statuses({0: ("expected_error", "E"), 1: ("passed", None)})
    assert status == "failed" and "rank(s) [0] only" in err
    assert combine_case_statuses({0: ("error", "tb")}) == ("error", "tb")


class _NullSink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self.calls.append((name, a))


def test_monitor_keeps_every_rank_s_backend_versions() -> None:
    """The job keeps the first rank's provenance and each rank's backend versions, so a report
    can say where ranks loaded different versions."""
    sink = _NullSink()
    mon = JobMonitor(JobSpec(1, "s", world_size=2), sink)  # type: ignore[arg-type]
    for r, version in ((0, "0.3.0"), (1, "0.2.9")):
        backends = [{"backend": "fla", "distribution": "flash-linear-attention", "version": version}]
        mon.handle(r, {"t": "info", "info": {"host": "h", "backends": backends}})
    info = next(a[0] for name, a in sink.calls if name == "info")
    assert info["backends"][0]["version"] == "0.3.0"
    assert [r["backends"] for r in info["ranks"]] == [{"fla": "0.3.0"}, {"fla": "0.2.9"}]


def test_monitor_prefers_a_dead_rank_over_its_peers_complaints() -> None:
    mon = JobMonitor(JobSpec(1, "s", world_size=2), _NullSink())  # type: ignore[arg-type]
    mon.handle(1, {"t": "case_start", "case": "c"})
    mon.handle(0, {"t": "fatal", "error": "peer went away", "failed_rank": 0, "cause": "peer"})
    assert mon.failure() is None  # a grace period for the more telling reason
    mon.rank_exited(1, "rank 1 killed by SIGKILL", -9, "last words")
    reason = mon.failure(settle=True)
    assert reason.startswith("rank 1 killed by SIGKILL during case 'c'") and "last words" in reason
    time.sleep(0.6)
    assert mon.failure() == reason


def test_monitor_reports_a_case_once_every_rank_ended_it() -> None:
    sink = _NullSink()
    mon = JobMonitor(JobSpec(1, "s", world_size=2), sink)  # type: ignore[arg-type]
    mon.handle(0, {"t": "cases", "total": 1, "names": ["c"]})
    mon.handle(0, {"t": "case_end", "case": "c", "status": "passed", "error": None})
    assert not [c for c in sink.calls if c[0] == "case_result"]
    mon.handle(1, {"t": "case_end", "case": "c", "status": "failed", "error": "expected E"})
    assert ("case_result", ("c", "failed", "rank 1: expected E")) in sink.calls
    assert ("progress", (1, 1, "c: failed")) in sink.calls


# --------------------------------------------------------------------------- snapshots


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_snapshot_per_commit_is_cached_by_sha(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    shas = []
    for value in ("1", "2"):
        (repo / "value.txt").write_text(value)
        _git(repo, "add", "value.txt")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", value)
        shas.append(_git(repo, "rev-parse", "HEAD").strip())
    cache = SnapshotCache(repo, tmp_path / "cache")
    first = cache.path(shas[0][:10])
    assert first.name == shas[0] and (first / "value.txt").read_text() == "1"
    assert (first / COMMIT_FILE).read_text().strip() == shas[0]
    assert (cache.path("HEAD") / "value.txt").read_text() == "2"
    (first / "value.txt").write_text("changed")  # proves the second call reuses the cached tree
    assert (cache.path(shas[0]) / "value.txt").read_text() == "changed"
    with pytest.raises(SnapshotError, match="deadbeef"):
        cache.path("deadbeef")


def test_executor_device_tables_agree_with_gdn_device() -> None:
    """The executors keep torch out of the service, so they carry copies of these two facts."""
    from gdn import device as devices
    from workers.executors.local import _VISIBLE_ENV, DEVICE_KINDS
    from workers.executors.ray_actor import _VISIBLE

    assert DEVICE_KINDS == devices.DEVICE_KINDS
    for kind in ("cuda", "npu"):
        assert _VISIBLE_ENV[kind] == _VISIBLE[kind][1] == devices.visible_devices_env(kind)


def test_make_executor_names_the_valid_kinds() -> None:
    with pytest.raises(ValueError, match=r"unknown executor kind 'slurm'; expected one of local, ray"):
        make_executor("slurm")
    local = make_executor("local", cpu_max_world_size=3)
    assert local.max_world_size("cpu") == 3
    with pytest.raises(ValueError, match="unknown device kind 'tpu'"):
        local.max_world_size("tpu")


# --------------------------------------------------------------------------- run summary


def test_summary_takes_the_worst_rank_per_repetition_first() -> None:
    samples = [
        Sample("c", "err", 1.0, rank=0, idx=0), Sample("c", "err", 3.0, rank=1, idx=0),
        Sample("c", "err", 2.0, rank=0, idx=1), Sample("c", "err", 0.5, rank=1, idx=1),
        Sample("c", "speedup", 4.0, rank=0), Sample("c", "speedup", 1.5, rank=1),
    ]
    rows = {r["metric"]: r for r in summarise(_VerdictSuite(), samples)}
    assert rows["err"]["count"] == 2 and rows["err"]["min"] == 2.0 and rows["err"]["median"] == 2.5
    assert rows["err"]["passed"] is False
    assert rows["speedup"]["median"] == 1.5 and rows["speedup"]["passed"] is False  # worst = min


def test_a_crash_after_a_rank_finished_is_logged_not_failed() -> None:
    sink = _NullSink()
    mon = JobMonitor(JobSpec(1, "s", world_size=1), sink)  # type: ignore[arg-type]
    mon.handle(0, {"t": "done"})
    mon.rank_exited(0, "rank 0 killed by SIGSEGV", -11, "")
    assert mon.failure(settle=True) is None and mon.all_done
    assert ("log", ("[rank 0] rank 0 killed by SIGSEGV after finishing its cases",)) in sink.calls


def test_local_ranks_get_their_own_device_of_the_parents_visible_set(monkeypatch, tmp_path: Path) -> None:
    from workers.executors.local import LocalExecutor

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    spec = JobSpec(1, "s", device="cuda", world_size=2)
    env = LocalExecutor().rank_env(spec, 1, tmp_path, 12345, devices=[2, 3])
    assert env["CUDA_VISIBLE_DEVICES"] == "7" and env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "12345"
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    npu_spec = JobSpec(1, "s", device="npu", world_size=2)
    npu = LocalExecutor().rank_env(npu_spec, 0, tmp_path, 1, devices=[1, 0])
    assert npu["ASCEND_RT_VISIBLE_DEVICES"] == "1"


def test_device_pool_never_hands_one_device_to_two_jobs() -> None:
    import threading

    from workers.executors.local import DevicePool

    pool, cancel = DevicePool(3), threading.Event()
    first = pool.acquire(2, cancel, None)
    assert first == [0, 1]
    assert pool.acquire(2, cancel, 0.3) is None  # only one free: waits, then gives up
    threading.Timer(0.3, pool.release, args=(first,)).start()
    assert sorted(pool.acquire(3, cancel, 5.0)) == [0, 1, 2]
    cancel.set()
    assert pool.acquire(1, cancel, None) is None
    with pytest.raises(ValueError, match="4 devices requested, this machine has 3"):
        pool.acquire(4, cancel, None)


@pytest.mark.slow  # a subprocess that imports torch
def test_counting_accelerators_keeps_torch_out_of_the_executor_process() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from workers.executors.local import LocalExecutor; e = LocalExecutor(); "
        "print(e.max_world_size('cuda') >= 0, e.max_world_size('cpu'), 'torch' in sys.modules)"
    )
    cmd = [sys.executable, "-c", code]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "8", "False"]


def test_a_suite_runs_only_on_its_devices_and_world_sizes() -> None:
    from workers.runtime import check_suite_fits
    from workers.suite import UnknownSuiteInput

    class TwoRanksOnGPU(_VerdictSuite):
        devices = ("cuda",)
        min_world_size = 2

    check_suite_fits(TwoRanksOnGPU(), "cuda", 2)
    with pytest.raises(UnknownSuiteInput, match="does not run on 'cpu'; it runs on cuda"):
        check_suite_fits(TwoRanksOnGPU(), "cpu", 2)
    with pytest.raises(UnknownSuiteInput, match="needs world_size >= 2, got 1"):
        check_suite_fits(TwoRanksOnGPU(), "cuda", 1)
