"""The Ray driver process: the one process that joins the Ray cluster (`ray.init`) on the
service's behalf, so the service itself never does.

Ray ends a driver process it cannot keep connected (after 60 s without its GCS, and with a CHECK
failure when the cluster came back with a new id), so the driver is a process of its own that
may die and be replaced: the service (`workers.executors.ray_remote`) talks to it over one
connection and starts a new one whenever it exits. It runs `RayExecutor` and serves:

- calls (`most_ranks`, `free_ranks`, ... `CALLS`), answered with the value or the error's kind;
- runs: a job with its prepared sources (`workers.executors.job_sources`); what the executor
  reports to its sink comes back as messages, then the outcome;
- cancels of a run.

A health loop joins the cluster once its GCS answers, then every `HEALTH_PERIOD_S` asks the GCS
(with a client made for the call) whether this driver's node is alive and places a one-bundle
group on the head node (`RayExecutor.check_placement`): the service is ready only while that
works. When the GCS has not answered for `LOST_AFTER_S`, or answers without this driver's node
(the cluster restarted under it), the process exits: its runs end with it (Ray removes the
actors and groups of a driver that is gone) and the service re-queues their jobs without
spending an attempt. A run that fails while the cluster does not answer ends `interrupted` for
the same reason.

Two ways to start it:

- `python -m workers.executors.ray_driver --fd N`: the service's own child, on a machine that is
  a Ray node (or that starts a local cluster), speaking over the inherited socket N;
- `python -m workers.executors.ray_driver --listen HOST:PORT`: a listener on a Ray node (the head
  pod or container), for a service that runs outside the cluster. Each connection that proves it
  holds the cluster's Ray token (`RAY_AUTH_TOKEN`, or the file `RAY_AUTH_TOKEN_PATH`; an HMAC
  challenge, never sent) gets a driver process of its own, which lives as long as it.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from workers.executors.base import ExecutorUnavailable, JobOutcome, JobSpec
from workers.executors.job_sources import JobSources
from workers.job_env import SECRETS, protect_process

HEALTH_PERIOD_S = 2.0  # how often the driver checks it can still place work
LOST_AFTER_S = 10.0  # a GCS silent this long: the cluster is gone, the driver exits
BEAT_S = 1.0  # how often the driver tells the service its state
AUTH_TIMEOUT_S = 10.0  # how long a connecting service may take to prove it holds the token
LOST_EXIT = 3  # the driver's exit code when it left a cluster that went away
CALLS = frozenset({"most_ranks", "alive_ranks", "free_ranks", "max_world_size", "placement"})
SINK_CALLS = frozenset({"samples", "case_result", "progress", "info", "log", "waiting", "artifact"})
TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def ray_token() -> bytes:
    """The cluster's Ray token, as Ray reads it (`RAY_AUTH_TOKEN`, else the file named by
    `RAY_AUTH_TOKEN_PATH`): what a service must hold to be given a driver."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token and os.environ.get(TOKEN_PATH_ENV):
        token = Path(os.environ[TOKEN_PATH_ENV]).read_text().strip()
    if not token:
        raise RuntimeError(f"no Ray token: set {TOKEN_ENV} or {TOKEN_PATH_ENV} (the cluster's token auth); "
                           "a driver listener never runs without one")
    return token.encode()


def driver_environment() -> dict[str, str]:
    """The driver's environment: this process's, less the service's own secrets (a local
    cluster the driver starts copies it to every worker)."""
    return {k: v for k, v in os.environ.items() if k not in SECRETS}


class _PipeSink:
    """A `JobSink` that sends each report to the service as a message."""

    def __init__(self, server: DriverServer, job_id: int) -> None:
        self.server, self.job_id = server, job_id

    def __getattr__(self, name: str) -> Any:
        if name not in SINK_CALLS:
            raise AttributeError(name)
        return lambda *args: self.server.send(("sink", self.job_id, name, args))


class DriverServer:
    """Serves one connection with one `RayExecutor` (see the module docstring)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()
        self.executor: Any = None
        self.runs: dict[int, threading.Event] = {}
        self.state: dict[str, Any] = {"ready": False, "connected": False, "reason": "starting"}
        self.round_at = time.monotonic()  # when the health loop last completed a round

    def send(self, msg: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self.conn.send(msg)
        except (OSError, ValueError):  # the service is gone: so is everything run for it
            os._exit(0)

    def serve(self) -> None:
        kind, options = self.conn.recv()
        assert kind == "init", kind
        from workers.executors.ray_executor import RayExecutor

        self.executor = RayExecutor(**options)
        threading.Thread(target=self._health, name="gdnval-driver-health", daemon=True).start()
        threading.Thread(target=self._beat, name="gdnval-driver-beat", daemon=True).start()
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            if msg[0] == "call":
                threading.Thread(target=self._call, args=msg[1:], daemon=True).start()
            elif msg[0] == "run":
                self.runs[msg[1]] = threading.Event()
                threading.Thread(target=self._run, args=msg[1:], daemon=True).start()
            elif msg[0] == "cancel" and msg[1] in self.runs:
                self.runs[msg[1]].set()
            elif msg[0] == "close":
                os._exit(0)

    def _call(self, rid: int, method: str, args: Sequence[Any]) -> None:
        if method not in CALLS:
            self.send(("reply", rid, "error", f"unknown call {method!r}; expected one of {sorted(CALLS)}"))
        elif not self.state["ready"]:
            self.send(("reply", rid, "unavailable", self.state["reason"]))
        else:
            try:
                self.send(("reply", rid, "ok", getattr(self.executor, method)(*args)))
            except ExecutorUnavailable as exc:
                self.send(("reply", rid, "unavailable", str(exc)))
            except ValueError as exc:
                self.send(("reply", rid, "value", str(exc)))
            except Exception as exc:
                self.send(("reply", rid, "error", f"{type(exc).__name__}: {exc}"))

    def _run(self, job_id: int, spec: JobSpec, sources: JobSources, suite_module: str | None) -> None:
        from workers.registry import SUITE_MODULES

        if suite_module:
            SUITE_MODULES.setdefault(spec.suite, suite_module)
        cancel = self.runs[job_id]
        try:
            outcome = self.executor.run_prepared(spec, sources, _PipeSink(self, job_id), cancel)
        except Exception as exc:
            outcome = JobOutcome("failed", f"the Ray driver failed: {type(exc).__name__}: {exc}")
        if outcome.status == "failed" and not cancel.is_set():
            gone = self._cluster_gone()
            if gone is not None:
                outcome = JobOutcome("interrupted", f"the Ray cluster went away while it ran: {gone[0]}")
        self.runs.pop(job_id, None)
        self.send(("outcome", job_id, outcome.status, outcome.error))

    def _cluster_gone(self) -> tuple[str, bool] | None:
        """Why the cluster this driver joined does not answer, and whether that is for good (it
        restarted: this driver's node is not among its alive nodes); None while it answers."""
        gcs, node = self.state.get("gcs"), self.state.get("node_id")
        if not gcs:
            return str(self.state["reason"]), False
        try:
            alive = self.executor.cluster(gcs)["node_ids"]
        except ExecutorUnavailable as exc:
            return str(exc), False
        if node in alive:
            return None
        return f"the cluster at {gcs} restarted: this driver's node {node} is gone", True

    def _health(self) -> None:
        """Join once the cluster answers, then check it can place work; exit when it is lost."""
        while not self.state["connected"]:
            try:
                self.executor.cluster()  # fail in seconds where ray.init would wait
                gcs, node = self.executor.connect()
                self.state.update(connected=True, gcs=gcs, node_id=node, reason="joined")
            except Exception as exc:
                self.state["reason"] = f"waiting for the cluster: {exc}"
                self.round_at = time.monotonic()
                time.sleep(HEALTH_PERIOD_S)
        answered = time.monotonic()
        while True:
            gone = self._cluster_gone()
            try:
                if gone is None:
                    self.executor.check_placement()
                    cluster = self.executor.cluster(self.state["gcs"])
                    cluster.pop("node_ids", None)
                    self.state.update(ready=True, reason="ready", cluster=cluster)
            except Exception as exc:
                self.state.update(ready=False, reason=f"cannot place work: {exc}")
            if gone is None:
                answered = time.monotonic()
            else:
                self.state.update(ready=False, reason=gone[0])
                if gone[1] or time.monotonic() - answered > LOST_AFTER_S:
                    self.send(("state", dict(self.state, lost=True)))
                    os._exit(LOST_EXIT)
            self.round_at = time.monotonic()
            time.sleep(HEALTH_PERIOD_S)

    def _beat(self) -> None:
        while True:
            self.send(("state", dict(self.state, round_age=time.monotonic() - self.round_at)))
            time.sleep(BEAT_S)


def spawn_driver(sock: socket.socket) -> subprocess.Popen[bytes]:
    """A driver process serving `sock` (the socket is handed over; the caller closes its copy)."""
    return subprocess.Popen(
        [sys.executable, "-m", "workers.executors.ray_driver", "--fd", str(sock.fileno())],
        pass_fds=(sock.fileno(),), env=driver_environment(), stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _receive_timeout(sock: socket.socket, seconds: float) -> None:
    """A blocking socket whose reads give up after `seconds` (0: never)."""
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(seconds), 0))


def _handshake(sock: socket.socket, key: bytes, serving: bool) -> Connection:
    """The connection over `sock` once both sides proved they hold `key` (HMAC challenges both
    ways, as `multiprocessing.connection` does), within `AUTH_TIMEOUT_S`."""
    _receive_timeout(sock, AUTH_TIMEOUT_S)
    try:
        conn = Connection(os.dup(sock.fileno()))
        try:
            if serving:
                deliver_challenge(conn, key)
                answer_challenge(conn, key)
            else:
                answer_challenge(conn, key)
                deliver_challenge(conn, key)
        except BaseException:
            conn.close()
            raise
    finally:
        _receive_timeout(sock, 0)
    return conn


def connect(address: str, key: bytes, timeout_s: float = AUTH_TIMEOUT_S) -> Connection:
    """A connection to the driver listener at `address` (HOST:PORT), authenticated with `key`."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        return _handshake(sock, key, serving=False)


def listen(address: str, key: bytes) -> None:
    """Serve driver connections at `address` forever: one driver process per authenticated one."""
    host, _, port = address.rpartition(":")
    server = socket.create_server((host, int(port)), reuse_port=False)
    print(f"gdnval Ray driver listening on {host}:{server.getsockname()[1]}", flush=True)
    while True:
        sock, peer = server.accept()
        threading.Thread(target=_admit, args=(sock, peer, key), daemon=True).start()


def _admit(sock: socket.socket, peer: Any, key: bytes) -> None:
    try:
        conn = _handshake(sock, key, serving=True)
    except Exception as exc:  # a wrong token, a timeout, a closed socket: nothing is started
        print(f"refused a driver connection from {peer}: {type(exc).__name__}: {exc}", flush=True)
        sock.close()
        return
    conn.close()  # the handshake's duplicate; the driver gets the socket itself
    proc = spawn_driver(sock)
    sock.close()
    print(f"driver process {proc.pid} serves {peer}", flush=True)
    proc.wait()
    print(f"driver process {proc.pid} for {peer} exited with {proc.returncode}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.executors.ray_driver",
                                     description="the gdnval Ray driver (see the module docstring)")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--fd", type=int, help="serve the connected socket with this descriptor")
    how.add_argument("--listen", metavar="HOST:PORT", help="accept services' connections here")
    args = parser.parse_args(argv)
    protect_process()  # it holds the Ray token: job code of this user cannot read it from here
    if args.listen:
        listen(args.listen, ray_token())
    else:
        DriverServer(Connection(args.fd)).serve()


if __name__ == "__main__":
    main()
