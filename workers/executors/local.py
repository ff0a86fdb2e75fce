"""Runs a job's ranks as local processes: for machines without Ray (the GPU box, `gdnval run`).

One process per rank (`workers.runtime`, forked from a server that imported torch once),
rendezvous on 127.0.0.1 and a free port, each accelerator rank restricted to its own device
through the family's visible-devices variable. Imports no torch (only `max_world_size` for an
accelerator asks torch, lazily).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any

from workers.backend_source import BackendSourceError, install_backend_source
from workers.deadline import collective_timeout_s
from workers.executors._monitor import JobMonitor
from workers.executors._process import RankProcess, describe_exit, end_ranks, remove_stale_folders
from workers.executors.base import Executor, JobOutcome, JobSink, JobSpec
from workers.job_env import job_environment, job_user
from workers.provenance import SOURCE_ROOT, source_commit
from workers.runtime import DEFAULT_PG_TIMEOUT_S, rank_environment
from workers.snapshot import REPO_ENV, SnapshotCache, SnapshotError

DEVICE_KINDS = ("cuda", "npu", "cpu")
_VISIBLE_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}  # = gdn.device


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@cache
def _accelerator_count(kind: str, python: str = sys.executable) -> int:
    """Devices of `kind` here, asked of gdn.device in a child interpreter: the service process
    (which runs this executor) stays free of torch and of an initialised CUDA/NPU runtime."""
    code = f"from gdn import device; print(device.device_count({kind!r}))"
    path = os.pathsep.join(filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")]))
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=120,
            env={**job_environment(), "PYTHONPATH": path},
        )
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else 0
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


def rank_payload(spec: JobSpec, commit: str | None) -> dict[str, Any]:
    """What `workers.runtime` reads from GDNVAL_RANK_PAYLOAD (same for both executors)."""
    from workers.registry import SUITE_MODULES

    pg_timeout = collective_timeout_s(spec.deadline_s) if spec.deadline_s else DEFAULT_PG_TIMEOUT_S
    return {
        "suite": spec.suite,
        # forward the module so suites registered at run time (tests) resolve in the rank too
        "suite_module": SUITE_MODULES.get(spec.suite),
        "preset": spec.preset,
        "params": dict(spec.params),
        "device": spec.device,
        "world_size": spec.world_size,
        "commit": commit,
        "deterministic": spec.deterministic,
        "pg_timeout_s": pg_timeout,
        "seed": 0,
        "job_id": spec.job_id,
        "cases": list(spec.cases) if spec.cases else None,
        "skip_cases": list(spec.skip_cases),
    }


def check_spec(spec: JobSpec, max_world_size: int) -> str | None:
    """Why the spec cannot run here, or None."""
    if spec.device not in DEVICE_KINDS:
        return f"unknown device kind {spec.device!r}; expected one of {', '.join(DEVICE_KINDS)}"
    if spec.world_size < 1:
        return f"world_size must be >= 1, got {spec.world_size}"
    if max_world_size == 0:
        return f"no {spec.device} device is available to this executor (world_size {spec.world_size} asked)"
    if spec.world_size > max_world_size:
        return (
            f"world_size {spec.world_size} exceeds the {max_world_size} {spec.device} rank(s) "
            "this executor can run"
        )
    return None


class DevicePool:
    """The accelerators of one family on this machine, handed to jobs so concurrent jobs never
    share a device (a job waits until enough are free)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._free = list(range(count))
        self._cond = threading.Condition()

    def acquire(self, n: int, cancel: threading.Event, timeout_s: float | None) -> list[int] | None:
        """`n` free device indices, or None when cancelled or `timeout_s` passed first."""
        if n > self.count:
            raise ValueError(f"{n} devices requested, this machine has {self.count}")
        end = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while len(self._free) < n:
                if cancel.is_set() or (end is not None and time.monotonic() >= end):
                    return None
                self._cond.wait(0.2)
            taken, self._free = self._free[:n], self._free[n:]
            return taken

    def release(self, indices: list[int]) -> None:
        with self._cond:
            self._free = sorted(set(self._free) | set(indices))
            self._cond.notify_all()


class LocalExecutor(Executor):
    """Ranks as child processes of this one.

    repo: git repository whose commits jobs may ask for (default GDNVAL_REPO; none: the installed
    code runs and its commit is recorded). cache_dir: snapshot cache (default
    GDNVAL_SNAPSHOT_CACHE). cpu_max_world_size: the most CPU ranks a job may have. python: the
    interpreter that runs the ranks. fork_ranks: fork them from a server that imported torch once
    (`workers.executors._fork_server`) rather than start each as a fresh interpreter.
    """

    kind = "local"

    def __init__(
        self,
        *,
        repo: str | Path | None = None,
        cache_dir: str | Path | None = None,
        cpu_max_world_size: int = 8,
        python: str = sys.executable,
        poll_s: float = 0.2,
        fork_ranks: bool = True,
    ) -> None:
        repo = repo or os.environ.get(REPO_ENV) or None  # the service's setting, or the environment
        self.snapshots = SnapshotCache(repo, cache_dir) if repo else None
        self.backend_cache = Path(cache_dir).parent / "backends" if cache_dir else None
        self.cpu_max_world_size = cpu_max_world_size
        self.python = python
        self.poll_s = poll_s
        self.fork_ranks = fork_ranks
        remove_stale_folders()  # what ranks of a killed executor left on this machine
        self.job_user = job_user()  # who job code runs as (None: this process's user)
        self._pools: dict[str, DevicePool] = {}
        self._pools_lock = threading.Lock()

    def max_world_size(self, device: str) -> int:
        if device not in DEVICE_KINDS:
            raise ValueError(f"unknown device kind {device!r}; expected one of {', '.join(DEVICE_KINDS)}")
        return self.cpu_max_world_size if device == "cpu" else _accelerator_count(device, self.python)

    def source(self, spec: JobSpec, sink: JobSink | None = None) -> tuple[Path, str | None]:
        """(source root the ranks import from, its commit): the job's commit or the installed code."""
        if self.snapshots is not None and spec.commit:
            return self.snapshots.path(spec.commit), self.snapshots.resolve(spec.commit)
        installed = source_commit()
        if spec.commit and sink is not None and not (installed or "").startswith(spec.commit):
            sink.log(
                f"job asks for commit {spec.commit} but no repository is configured; "
                f"running the installed code (commit {installed or 'unknown'})"
            )
        return SOURCE_ROOT, installed

    def _pool(self, device: str) -> DevicePool:
        with self._pools_lock:
            if device not in self._pools:
                self._pools[device] = DevicePool(self.max_world_size(device))
            return self._pools[device]

    def rank_env(
        self, spec: JobSpec, rank: int, root: Path, port: int, devices: list[int] | None = None,
        extra_paths: list[Path] | None = None,
    ) -> dict[str, str]:
        """The rank's environment; `devices[rank]` is its accelerator's index on this machine;
        `extra_paths` (an installed backend source) follow the source root on the path. Built from
        the allow-list of `workers.job_env`: job code never sees the service's secrets."""
        env = job_environment()
        env.update(
            rank_environment(spec.device, deterministic=spec.deterministic, world_size=spec.world_size)
        )
        paths = [str(root), *map(str, extra_paths or []), *filter(None, [os.environ.get("PYTHONPATH")])]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(spec.world_size),
                "LOCAL_WORLD_SIZE": str(spec.world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
        visible = _VISIBLE_ENV.get(spec.device)
        if visible:
            index = devices[rank] if devices else rank
            parent = [d.strip() for d in os.environ.get(visible, "").split(",") if d.strip()]
            env[visible] = parent[index] if index < len(parent) else str(index)
        return env

    def run(self, spec: JobSpec, sink: JobSink, cancel: threading.Event) -> JobOutcome:
        try:
            problem = check_spec(spec, self.max_world_size(spec.device))
        except ValueError as exc:
            problem = str(exc)
        if problem:
            return JobOutcome("failed", problem)
        try:
            root, commit = self.source(spec, sink)
        except SnapshotError as exc:
            return JobOutcome("failed", f"cannot build the source snapshot: {exc}")
        payload = rank_payload(spec, commit)
        extra: list[Path] = []
        if spec.backend_source:
            try:
                source = install_backend_source(spec.backend_source, self.backend_cache, self.python, cancel,
                                                self.job_user)
                extra.append(source)
            except BackendSourceError as exc:
                if cancel.is_set():
                    return JobOutcome("cancelled", "cancelled while the backend source was installed")
                return JobOutcome("failed", f"cannot install the backend source: {exc}")
            sink.log(f"backend source {spec.backend_source} installed at {extra[0]}")
        devices: list[int] | None = None
        if spec.device != "cpu":
            devices = self._pool(spec.device).acquire(spec.world_size, cancel, spec.deadline_s)
            if devices is None:
                if cancel.is_set():
                    return JobOutcome("cancelled", "cancelled while waiting for a free device")
                need = f"{spec.world_size} free {spec.device} device(s)"
                return JobOutcome("failed", f"no {need} before the job's deadline")
            sink.log(f"{spec.device} device(s) {devices} of this machine")
        try:
            return self._run(spec, sink, cancel, root, payload, devices, extra)
        finally:
            if devices is not None:
                self._pool(spec.device).release(devices)

    def _run(
        self,
        spec: JobSpec,
        sink: JobSink,
        cancel: threading.Event,
        root: Path,
        payload: dict[str, Any],
        devices: list[int] | None,
        extra_paths: list[Path] | None = None,
    ) -> JobOutcome:
        wakeup = threading.Event()
        port = free_port()
        procs: list[RankProcess] = []
        monitor = JobMonitor(spec, sink)
        start = time.monotonic()
        try:
            for rank in range(spec.world_size):
                env = self.rank_env(spec, rank, root, port, devices, extra_paths)
                procs.append(RankProcess(rank, payload, env, cwd=root, python=self.python, wakeup=wakeup,
                                         user=self.job_user, fork=self.fork_ranks))
            return self._watch(spec, procs, monitor, wakeup, cancel, start)
        except Exception as exc:  # the executor itself broke (cannot spawn, ...): say so, never hang
            return JobOutcome("failed", f"local executor error: {type(exc).__name__}: {exc}")
        finally:
            end_ranks(procs)
            for p in procs:  # whatever was still in the pipes (samples of a cancelled job)
                for msg in p.drain():
                    if msg.get("t") == "samples":
                        monitor.handle(p.rank, msg)
            monitor.flush_info()

    def _watch(
        self,
        spec: JobSpec,
        procs: list[RankProcess],
        monitor: JobMonitor,
        wakeup: threading.Event,
        cancel: threading.Event,
        start: float,
    ) -> JobOutcome:
        reported: set[int] = set()
        while True:
            wakeup.clear()
            for p in procs:
                for msg in p.drain():
                    monitor.handle(p.rank, msg)
                if p.exited and p.rank not in reported:
                    reported.add(p.rank)
                    rc = p.returncode if p.returncode is not None else -9
                    monitor.rank_exited(p.rank, f"rank {p.rank} {describe_exit(rc)}", rc, p.output_tail())
                elif not p.exited:
                    monitor.check_silence(p.rank, p.silent_s, f" (pid {p.pid})")
            outcome = monitor.outcome(cancel.is_set(), len(reported), start)
            if outcome is not None:
                return outcome
            wakeup.wait(self.poll_s)

