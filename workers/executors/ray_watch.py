"""Watching a Ray job's ranks: each round asks every rank's actor for what its rank wrote
(`RankActor.poll`), feeds it to the job monitor, and decides about ranks that went quiet.

- A rank whose actor call fails is looked up in the GCS: a node that left the cluster fails the
  job at once, naming the rank, the node id and its host; an actor Ray only calls unavailable
  (`ActorUnavailableError`, which may pass) is asked again for up to `grace_s` while the job's
  failure waits for it (other ranks soon report they lost a peer: the lost rank is the better
  reason), then failed as dead with where it ran.
- A running rank silent past the job's stall limit (no beat, message or output: its process is
  stopped or frozen) fails the job naming it (`JobMonitor.check_silence`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from workers.executors._monitor import JobMonitor
from workers.executors._process import describe_exit
from workers.executors.base import ExecutorUnavailable, JobOutcome

NODE_CHECK_S = 1.0  # how often the GCS is asked about the nodes of unreachable actors


def get_starts(ray: Any, starts: list[Any], monitor: JobMonitor, nodes: list[dict[str, Any]]) -> None:
    """Wait for every actor's `start`; a rank that could not start is failed where it ran."""
    for rank, ref in enumerate(starts):
        try:
            ray.get(ref, timeout=120.0)
        except Exception as exc:
            why = f"rank {rank}{on_node(nodes, rank)} could not start: {short(exc)}"
            monitor.rank_exited(rank, why, None, "")


class RankWatch:
    """One job's watch loop (see the module docstring). `alive_nodes` answers the ids of the
    cluster's alive nodes (the GCS, asked now)."""

    def __init__(self, ray: Any, actors: list[Any], monitor: JobMonitor, nodes: list[dict[str, Any]],
                 grace_s: float, alive_nodes: Callable[[], set[str]]) -> None:
        self.ray, self.actors, self.monitor, self.nodes = ray, actors, monitor, nodes
        self.grace_s, self.alive_nodes = grace_s, alive_nodes
        self.reported: set[int] = set()
        self.unavailable: dict[int, float] = {}  # rank -> when Ray first said its actor is unavailable
        self._alive: tuple[float, set[str] | None] = (0.0, None)

    def run(self, cancel: threading.Event, start: float, poll_s: float) -> JobOutcome:
        while True:
            polled = [r for r in range(len(self.actors)) if r not in self.reported]
            refs = {self.actors[r].poll.remote(): r for r in polled}
            if refs:
                ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=10.0)
                for ref in ready:
                    self._take(refs[ref], ref)
            hold = bool(self.unavailable)
            outcome = self.monitor.outcome(cancel.is_set(), len(self.reported), start, hold=hold)
            if outcome is not None:
                return outcome
            cancel.wait(poll_s)

    def _take(self, rank: int, ref: Any) -> None:
        try:
            msgs, rc, tail, silent = self.ray.get(ref)
            self.unavailable.pop(rank, None)
        except Exception as exc:  # the actor itself is gone or unreachable (node lost, killed, OOM)
            self._lost(rank, exc)
            return
        for msg in msgs:
            self.monitor.handle(rank, msg)
        if rc is not None:
            self.reported.add(rank)
            self.monitor.rank_exited(rank, f"rank {rank} {describe_exit(rc)}", rc, tail)
        else:
            self.monitor.check_silence(rank, silent, on_node(self.nodes, rank))

    def _lost(self, rank: int, exc: BaseException) -> None:
        from ray.exceptions import ActorUnavailableError

        where = on_node(self.nodes, rank)
        if self._node_gone(rank, fresh=not isinstance(exc, ActorUnavailableError)):
            self.reported.add(rank)
            self.unavailable.pop(rank, None)
            self.monitor.rank_exited(rank, f"rank {rank}{where}: the node left the cluster, and its actor "
                                     f"and rank with it ({short(exc, 200)})", None, "")
        elif not still_unavailable(exc, rank, self.unavailable, self.grace_s):
            self.reported.add(rank)
            self.unavailable.pop(rank, None)
            self.monitor.rank_exited(rank, f"rank {rank}{where} actor died: {short(exc)}", None, "")

    def _node_gone(self, rank: int, fresh: bool = False) -> bool:
        """Whether the GCS no longer lists `rank`'s node as alive (asked at most every
        `NODE_CHECK_S` unless `fresh`); False when it cannot tell."""
        if rank >= len(self.nodes):
            return False
        at, alive = self._alive
        if fresh or time.monotonic() - at > NODE_CHECK_S:
            try:
                alive = self.alive_nodes()
            except ExecutorUnavailable:
                alive = None
            self._alive = (time.monotonic(), alive)
        return alive is not None and self.nodes[rank].get("node_id") not in alive


def still_unavailable(exc: BaseException, rank: int, since: dict[int, float], grace_s: float) -> bool:
    """Whether `exc` is Ray's ActorUnavailableError (the actor may be unreachable only for a
    moment) for `rank`, first seen (recorded in `since`) less than `grace_s` ago: then the call
    is retried instead of the rank being failed as dead."""
    from ray.exceptions import ActorUnavailableError

    if not isinstance(exc, ActorUnavailableError):
        return False
    first = since.setdefault(rank, time.monotonic())
    return time.monotonic() - first < grace_s


def rank_extra(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the job info records per rank about where Ray put it."""
    return {
        "node_id": node.get("node_id"),
        "node_ip": node.get("ip"),
        "node_host": node.get("host"),
        "actor_pid": node.get("pid"),
        "ray_visible_devices": {k: v for k, v in (node.get("env") or {}).items() if v is not None},
    }


def on_node(nodes: list[dict[str, Any]], rank: int) -> str:
    """` on node <id> (host <name>, <ip>)` for `rank`, empty before it was placed."""
    if rank >= len(nodes):
        return ""
    node = nodes[rank]
    return f" on node {node.get('node_id')} (host {node.get('host')}, {node.get('ip')})"


def short(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."
