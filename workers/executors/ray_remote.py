"""The Ray executor as the service holds it: everything Ray does happens in a driver process
(`workers.executors.ray_driver`) that this class starts, or reaches, and replaces whenever it
ends. The service process never imports Ray, so neither Ray's exit after losing its GCS nor a
CHECK failure against a restarted cluster can take the API and the dispatcher with it.

- Where the driver runs: by default a child process on this machine (`driver=None`), which
  joins the cluster at `address` (this machine must be a Ray node) or starts a local cluster;
  with `driver="HOST:PORT"`, a listener on a node of the cluster (the head pod), which gives
  this service a driver process of its own once it proved it holds the cluster's Ray token.
- Readiness (`cluster`) is what the driver last reported, never a wait: ready only while it is
  joined and placed its readiness group; otherwise `ExecutorUnavailable` with its reason.
- Calls (`most_ranks`, `free_ranks`, ...) go to the driver and wait at most `CALL_TIMEOUT_S`;
  with no driver joined they raise `ExecutorUnavailable` at once (the API answers 503, the
  dispatcher claims nothing).
- A run prepares the job's code here (`prepare_sources`: the commit's archive, the backend
  source's fetch), hands it to the driver and applies the driver's reports to the job's sink
  in the job's own thread, so a sink that waits for the store never holds up the driver. When
  the driver ends or stops answering (no message for `SILENT_S`, or its health loop stuck for
  `HUNG_S`) its runs end `interrupted`: the dispatcher re-queues them without spending an
  attempt, and a new driver is started after `RESTART_S` (doubling to `RESTART_MAX_S` while
  they keep ending within a minute).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from workers.executors.base import Executor, ExecutorUnavailable, JobOutcome, JobSink, JobSpec
from workers.executors.job_sources import prepare_sources
from workers.executors.ray_driver import SINK_CALLS, connect, ray_token, spawn_driver
from workers.executors.ray_placement import CPU_NODE_RESOURCE
from workers.registry import SUITE_MODULES
from workers.snapshot import REPO_ENV, SnapshotCache

log = logging.getLogger("gdnval.ray")
CALL_TIMEOUT_S = 10.0
SILENT_S = 15.0  # a driver that sent nothing this long is frozen: it is replaced
HUNG_S = 45.0  # a driver whose health loop has not finished a round this long is stuck in Ray
RESTART_S, RESTART_MAX_S = 1.0, 10.0


@dataclass
class _Link:
    """One driver: its connection, and its process when it is our child."""

    conn: Connection
    proc: subprocess.Popen[bytes] | None
    send_lock: threading.Lock
    started: float
    last_heard: float

    def send(self, msg: tuple[Any, ...]) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def end(self) -> None:
        """Close the connection (a driver exits when it does) and kill our child for certain."""
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)


class RayDriverExecutor(Executor):
    """The `ray` executor of the service (see the module docstring); `options` are those of
    `RayExecutor`, passed on to the driver."""

    kind = "ray"

    def __init__(self, *, driver: str | None = None, repo: str | Path | None = None,
                 backend_cache: str | Path | None = None, **options: Any) -> None:
        self.driver = driver
        self.options = dict(options)
        self.placement_strategy = str(options.get("placement_strategy", "PACK"))
        self.cpu_node_resource = options.get("cpu_node_resource", CPU_NODE_RESOURCE)
        repo = repo or os.environ.get(REPO_ENV) or None  # the service's setting, or the environment
        self.snapshots = SnapshotCache(repo) if repo else None
        self.backend_cache = Path(backend_cache) if backend_cache else None
        self._state: dict[str, Any] = {"ready": False, "reason": "starting the Ray driver"}
        self._link: _Link | None = None
        self._calls: dict[int, list[Any]] = {}
        self._runs: dict[int, queue.Queue[tuple[Any, ...]]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._supervise, name="gdnval-ray-driver", daemon=True).start()
        threading.Thread(target=self._watch, name="gdnval-ray-driver-watch", daemon=True).start()

    # -- the driver's life ----------------------------------------------------------------------

    def _start(self) -> _Link:
        """A new driver: our child over a socket pair, or one the listener at `driver` starts."""
        now = time.monotonic()
        if self.driver:
            return _Link(connect(self.driver, ray_token()), None, threading.Lock(), now, now)
        ours, theirs = socket.socketpair()
        try:
            proc = spawn_driver(theirs)
        finally:
            theirs.close()
        return _Link(Connection(ours.detach()), proc, threading.Lock(), now, now)

    def _supervise(self) -> None:
        wait = RESTART_S
        where = f"the Ray driver listener at {self.driver}" if self.driver else "a Ray driver process"
        while not self._closed.is_set():
            try:
                link = self._start()
                link.send(("init", self.options))
            except Exception as exc:
                self._set_state(False, f"cannot start {where}: {type(exc).__name__}: {exc}")
                self._closed.wait(wait)
                wait = min(RESTART_MAX_S, wait * 2)
                continue
            self._link = link
            why = self._read(link)
            self._link = None
            link.end()
            code = link.proc.returncode if link.proc is not None else None
            reason = f"the Ray driver ended ({why}{'' if code is None else f', exit code {code}'})"
            self._set_state(False, f"{reason}; starting another")
            self._drop(reason)
            if not self._closed.is_set():
                log.warning("%s; starting another in %g s", reason, wait)
            wait = RESTART_S if time.monotonic() - link.started > 60 else min(RESTART_MAX_S, wait * 2)
            self._closed.wait(wait)

    def _read(self, link: _Link) -> str:
        """Deliver the driver's messages until its connection ends; returns why it ended."""
        while True:
            try:
                msg = link.conn.recv()
            except EOFError:
                return "its connection closed"
            except OSError as exc:
                return f"{type(exc).__name__}: {exc}"
            link.last_heard = time.monotonic()
            kind = msg[0]
            if kind == "state":
                state = msg[1]
                if state.get("lost"):
                    log.warning("the Ray driver left its cluster: %s", state.get("reason"))
                self._set_state(bool(state.get("ready")), str(state.get("reason")), state)
            elif kind == "reply":
                entry = self._calls.get(msg[1])
                if entry is not None:
                    entry[1] = msg[2:]
                    entry[0].set()
            elif kind in ("sink", "outcome"):
                run = self._runs.get(msg[1])
                if run is not None:
                    run.put(msg)

    def _watch(self) -> None:
        """End a driver that went silent or whose health loop is stuck (a frozen process, a Ray
        call that never returns): `_supervise` then starts another."""
        while not self._closed.wait(1.0):
            link = self._link
            if link is None:
                continue
            silent = time.monotonic() - link.last_heard
            stuck = float(self._state.get("round_age") or 0.0)
            if silent > SILENT_S or stuck > HUNG_S:
                why = f"silent for {silent:.0f} s" if silent > SILENT_S else f"stuck in Ray for {stuck:.0f} s"
                log.warning("ending the Ray driver: %s", why)
                link.end()

    def _set_state(self, ready: bool, reason: str, state: Mapping[str, Any] | None = None) -> None:
        self._state = {**(state or {"connected": False}), "ready": ready, "reason": reason}

    def _drop(self, reason: str) -> None:
        """The driver is gone: its calls fail, its runs end interrupted."""
        with self._lock:
            calls, runs = list(self._calls.values()), list(self._runs.values())
        for entry in calls:
            entry[1] = ("unavailable", reason)
            entry[0].set()
        for run in runs:
            run.put(("lost", reason))

    # -- calls ----------------------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        link = self._link
        if link is None or not self._state.get("ready"):
            raise ExecutorUnavailable(f"the Ray cluster cannot take work now: {self._state['reason']}")
        rid = next(self._ids)
        entry: list[Any] = [threading.Event(), None]
        with self._lock:
            self._calls[rid] = entry
        try:
            link.send(("call", rid, method, args))
            if not entry[0].wait(CALL_TIMEOUT_S):
                raise ExecutorUnavailable(f"the Ray driver did not answer {method} in {CALL_TIMEOUT_S:g} s")
        except OSError as exc:
            raise ExecutorUnavailable(f"the Ray driver is gone: {exc}") from exc
        finally:
            with self._lock:
                self._calls.pop(rid, None)
        kind, value = entry[1]
        if kind == "ok":
            return value
        if kind == "unavailable":
            raise ExecutorUnavailable(str(value))
        if kind == "value":
            raise ValueError(str(value))
        raise RuntimeError(f"the Ray driver failed {method}: {value}")

    def most_ranks(self, device: str, placement: str | None = None) -> int:
        return int(self._call("most_ranks", device, placement))

    def max_world_size(self, device: str) -> int:
        return int(self._call("max_world_size", device))

    def alive_ranks(self, device: str, placement: str | None = None) -> int | None:
        return self._call("alive_ranks", device, placement)  # type: ignore[no-any-return]

    def free_ranks(self, device: str, placement: str | None = None) -> int | None:
        return self._call("free_ranks", device, placement)  # type: ignore[no-any-return]

    def placement(self, device: str, world_size: int, strategy: str | None = None,
                  timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Where `world_size` ranks would run (`RayExecutor.placement`, asked of the driver)."""
        return self._call("placement", device, world_size, strategy, timeout_s)  # type: ignore[no-any-return]

    def cluster(self) -> Mapping[str, Any]:
        state = self._state
        if not state.get("ready"):
            raise ExecutorUnavailable(str(state.get("reason")))
        return dict(state.get("cluster") or {})

    # -- runs -----------------------------------------------------------------------------------

    def run(self, spec: JobSpec, sink: JobSink, cancel: threading.Event) -> JobOutcome:
        sources = prepare_sources(spec, self.snapshots, self.backend_cache, sink, cancel)
        if isinstance(sources, JobOutcome):
            return sources
        link = self._link
        if link is None:
            return JobOutcome("interrupted", f"no Ray driver to run it: {self._state['reason']}")
        inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        with self._lock:
            self._runs[spec.job_id] = inbox
        try:
            try:  # a suite registered at run time (a plugin, a test) is registered in the driver too
                link.send(("run", spec.job_id, spec, sources, SUITE_MODULES.get(spec.suite)))
            except OSError as exc:
                return JobOutcome("interrupted", f"the Ray driver is gone: {exc}")
            return self._follow(spec.job_id, link, inbox, sink, cancel)
        finally:
            with self._lock:
                self._runs.pop(spec.job_id, None)

    def _follow(self, job_id: int, link: _Link, inbox: queue.Queue[tuple[Any, ...]], sink: JobSink,
                cancel: threading.Event) -> JobOutcome:
        """Apply the driver's reports to `sink` until the run's outcome (or the driver's end)."""
        asked = False
        while True:
            if cancel.is_set() and not asked:
                asked = True
                with contextlib.suppress(OSError):
                    link.send(("cancel", job_id))
            try:
                msg = inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if msg[0] == "sink" and msg[2] in SINK_CALLS:
                getattr(sink, msg[2])(*msg[3])
            elif msg[0] == "outcome":
                return JobOutcome(msg[2], msg[3])
            elif msg[0] == "lost":
                if cancel.is_set():
                    return JobOutcome("cancelled", f"cancelled; {msg[1]}")
                return JobOutcome("interrupted", str(msg[1]))

    def close(self) -> None:
        self._closed.set()
        link = self._link
        if link is not None:
            with contextlib.suppress(OSError):
                link.send(("close",))
            link.end()
