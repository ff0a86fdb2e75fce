"""Placement on a Ray cluster: what one rank asks for (its bundle), how many ranks fit per node
and strategy (ever, on the alive nodes, free now), and a job's placement group with one actor
per bundle, acquired (waiting for free resources or for nodes asked of the autoscaler) and
released (actors killed, the group removed).

`RayPlacement` is the part of `RayExecutor` that does this; it reads the executor's settings
(`placement_strategy`, `cpu_node_resource`, `cpus_per_rank`, `max_nodes`, `node_wait_s`) and
keeps what its jobs wait for (`_unplaced`, `_demand`, under `_lock`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from workers.executors.base import check_placement
from workers.executors.local import DEVICE_KINDS
from workers.executors.ray_actor import RankActor

CPU_NODE_RESOURCE = "cpu_node"  # marker resource of the nodes that take CPU ranks
CPU_NODE_SHARE = 0.001  # what one CPU rank asks of it: a marker, the CPUs bound the count
JOB_ID_ENV = "GDNVAL_JOB_ID"  # in every rank actor's runtime_env: Ray's view names the job
PLACEMENT_QUIET_S = 5.0  # a group that fits the free resources but waits longer is reported waiting


def job_name(job_id: int) -> str:
    """The name of a job's placement group in Ray; its rank actors append `-rank-<r>`."""
    return f"gdnval-job-{job_id}"


def fits(resources: Mapping[str, float], need: Mapping[str, float]) -> int:
    """How many bundles `need` fit into one node's `resources`."""
    return int(min(float(resources.get(k, 0.0)) / v + 1e-9 for k, v in need.items() if v > 0))


def capacity(per_node: list[int], strategy: str) -> int:
    """Ranks a placement group of `strategy` can hold, given how many bundles fit on each node."""
    if strategy == "STRICT_PACK":
        return max(per_node, default=0)
    if strategy == "STRICT_SPREAD":
        return sum(1 for n in per_node if n > 0)
    return sum(per_node)



class Cancelled(Exception):
    """The job was cancelled while its placement group waited."""


class RayPlacement:
    """Capacity and placement groups of the executor's cluster (see the module docstring)."""

    placement_strategy: str
    cpu_node_resource: str | None
    cpus_per_rank: float
    max_nodes: list[dict[str, float]]
    node_wait_s: float
    _lock: threading.Lock
    _unplaced: dict[int, tuple[str, int]]
    _demand: dict[int, list[dict[str, float]]]
    _actor_cls: Any

    def _ray(self) -> Any:
        raise NotImplementedError

    def bundle(self, device: str) -> dict[str, float]:
        """The resources of one rank: its accelerator (or the CPU-node marker) plus `cpus_per_rank`."""
        b: dict[str, float] = {"CPU": self.cpus_per_rank}
        if device == "cuda":
            b["GPU"] = 1
        elif device == "npu":
            b["NPU"] = 1
        elif self.cpu_node_resource:
            b[self.cpu_node_resource] = CPU_NODE_SHARE
        return b

    def _check_device(self, device: str) -> None:
        if device not in DEVICE_KINDS:
            raise ValueError(f"unknown device kind {device!r}; expected one of {', '.join(DEVICE_KINDS)}")

    def node_resources(self, free: bool) -> dict[str, dict[str, float]]:
        """Resources of every alive node by node id: their totals, or what is free now."""
        ray = self._ray()
        if free:
            from ray._private.state import available_resources_per_node  # DeveloperAPI, alive nodes only

            return {k: dict(v) for k, v in available_resources_per_node().items()}
        return {n["NodeID"]: dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")}

    def most_ranks(self, device: str, placement: str | None = None) -> int:
        self._check_device(device)
        need = self.bundle(device)
        strategy = check_placement(placement or self.placement_strategy)
        alive = capacity([fits(res, need) for res in self.node_resources(free=False).values()], strategy)
        declared = capacity([fits(res, need) for res in self.max_nodes], strategy)
        return max(alive, declared)

    def max_world_size(self, device: str) -> int:
        return self.most_ranks(device)

    def alive_ranks(self, device: str, placement: str | None = None) -> int:
        """Ranks of `device` the alive nodes could hold if idle (the declared nodes left out)."""
        self._check_device(device)
        need = self.bundle(device)
        per_node = [fits(res, need) for res in self.node_resources(free=False).values()]
        return capacity(per_node, check_placement(placement or self.placement_strategy))

    def _request_nodes(self) -> None:
        """Ask the autoscaler for the bundles of every job now waiting (each call replaces the
        last request; none waiting withdraws it)."""
        from ray.autoscaler.sdk import request_resources

        with self._lock:
            bundles = [dict(b) for group in self._demand.values() for b in group]
        request_resources(bundles=bundles)

    def free_ranks(self, device: str, placement: str | None = None) -> int:
        """Ranks of `device` placeable now: free resources per node, less the ranks of this
        executor's jobs whose placement group is not placed yet (Ray reserves nothing for them)."""
        self._check_device(device)
        need = self.bundle(device)
        per_node = [fits(res, need) for res in self.node_resources(free=True).values()]
        with self._lock:
            waiting = sum(n for d, n in self._unplaced.values() if d == device)
        return max(0, capacity(per_node, check_placement(placement or self.placement_strategy)) - waiting)

    # -- placement ----------------------------------------------------------------------------

    def _acquire(
        self,
        device: str,
        world_size: int,
        strategy: str,
        timeout_s: float,
        cancel: threading.Event | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        job_id: int | None = None,
        waiting: Callable[[str | None], None] | None = None,
        deadline_s: float | None = None,
    ) -> tuple[Any, list[Any]]:
        """A ready placement group and one actor per bundle; raises TimeoutError naming the need.
        `waiting` hears what the group waits for once it is not placed at once, and None when it
        is placed.

        With `job_id` the group is named `gdnval-job-<id>`, each actor `gdnval-job-<id>-rank-<r>`
        with `GDNVAL_JOB_ID` in its runtime_env, so Ray's own tools tie them to the job."""
        self._ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundle(device)
        token = id(object())
        with self._lock:
            self._unplaced[token] = (device, world_size)
        grow = bool(self.max_nodes) and world_size > self.alive_ranks(device, strategy)
        if grow:  # wait for the nodes the autoscaler is asked for, not for others' ranks to end
            timeout_s = min(self.node_wait_s, deadline_s or self.node_wait_s)
        group = job_name(job_id) if job_id is not None else ""
        pg = placement_group([dict(bundle) for _ in range(world_size)], strategy=strategy, name=group)
        actors: list[Any] = []
        waited = False
        try:
            end = time.monotonic() + timeout_s
            quiet_until = time.monotonic() + PLACEMENT_QUIET_S
            while not pg.wait(timeout_seconds=1):  # in steps, so a cancel is not stuck behind it
                if grow and token not in self._demand:
                    with self._lock:
                        self._demand[token] = [dict(bundle) for _ in range(world_size)]
                    self._request_nodes()
                if not waited and waiting is not None and (grow or time.monotonic() > quiet_until):
                    why = "not free"
                    if grow:
                        why = "more than the alive nodes hold, requested from the autoscaler"
                    need = f"{world_size} x {bundle} ({strategy})"
                    waiting(f"waiting for {need}: {why}, for up to {timeout_s:g} s")
                    waited = True
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                if time.monotonic() < end:
                    continue
                free = {k[:12]: {r: v for r, v in res.items() if r in bundle}
                        for k, res in self.node_resources(free=True).items()}
                asked = "; requested from the autoscaler, the nodes never came" if grow else ""
                raise TimeoutError(
                    f"could not place {world_size} rank(s) of {bundle} with {strategy} within "
                    f"{timeout_s:g} s{asked}; free now per node: {free}"
                )
            with self._lock:
                self._unplaced.pop(token, None)
            if waited and waiting is not None:
                waiting(None)
            for rank in range(world_size):
                opts: dict[str, Any] = {
                    "num_cpus": bundle["CPU"],
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=rank
                    ),
                    "max_restarts": 0,
                    "max_concurrency": RankActor.CONCURRENCY,
                    "name": f"{group}-rank-{rank}" if group else None,
                }
                if device == "cuda":
                    opts["num_gpus"] = 1
                elif device == "npu":
                    opts["resources"] = {"NPU": 1}
                env = dict(runtime_env or {})
                if job_id is not None:
                    env["env_vars"] = {**env.get("env_vars", {}), JOB_ID_ENV: str(job_id)}
                if env:
                    opts["runtime_env"] = env
                actors.append(self._actor_cls.options(**opts).remote(device, opts["name"] or ""))
            return pg, actors
        except BaseException:
            self._release(pg, actors)
            raise
        finally:
            with self._lock:
                self._unplaced.pop(token, None)
                asked = self._demand.pop(token, None)
            if asked is not None:  # placed, cancelled or timed out: withdraw what this job asked
                self._request_nodes()

    def _release(self, pg: Any, actors: list[Any]) -> None:
        """Kill the ranks, the actors and the placement group, and wait until the actors are gone."""
        ray = self._ray()
        from ray.util.placement_group import remove_placement_group

        kills = []
        for a in actors:
            with contextlib.suppress(Exception):  # an actor that already died
                kills.append(a.kill.remote())
        if kills:
            ray.wait(kills, num_returns=len(kills), timeout=5.0)
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        gone = [a.poll.remote() for a in actors]
        end = time.monotonic() + 10.0
        for ref in gone:  # a call on a killed actor fails once it is dead
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=max(0.1, end - time.monotonic()))
        with contextlib.suppress(Exception):
            remove_placement_group(pg)

    def placement(
        self, device: str, world_size: int, strategy: str | None = None, timeout_s: float = 30.0
    ) -> list[dict[str, Any]]:
        """Where `world_size` ranks of `device` would run: node, bundle and visible devices per rank.

        Places and releases real actors; for operators and the scheduling tests.
        """
        ray = self._ray()
        strategy = check_placement(strategy or self.placement_strategy)
        pg, actors = self._acquire(device, world_size, strategy, timeout_s)
        try:
            nodes = ray.get([a.node.remote() for a in actors], timeout=timeout_s)
            return [{"rank": r, "bundle": r, **n} for r, n in enumerate(nodes)]
        finally:
            self._release(pg, actors)

    # -- code under test ----------------------------------------------------------------------
