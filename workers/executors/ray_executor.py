"""Runs a job's ranks on a Ray cluster: one actor per rank, one placement group per job.

Each actor holds its rank's device as a Ray resource (`num_gpus=1` for CUDA, `{"NPU": 1}` for
Ascend, CPUs otherwise) and starts the rank as a child process (`python -m workers.runtime`, the
same runtime the local executor uses), so a rank that segfaults or kills itself leaves its actor
alive to report the exit code and output tail. The executor polls every actor for the channel
messages its rank wrote, so samples reach the sink while the job runs.

The code under test is the job's commit: with a configured repository the driver archives the
commit (`git archive`), puts the tar into the object store, and each actor extracts it once per
node into its snapshot cache; the rank imports from there. The actor itself always runs the
installed code, so an old commit cannot break the harness that reports on it.

`import ray` happens on first use, never at import time (the service imports this lazily too).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.executor import Executor, JobOutcome, JobSink, JobSpec
from workers.executors._monitor import JobMonitor
from workers.executors._process import RankProcess, describe_exit
from workers.executors.local import DEVICE_KINDS, check_spec, rank_payload
from workers.provenance import source_commit
from workers.snapshot import REPO_ENV, SnapshotCache, SnapshotError

RAY_ADDRESS_ENV = "GDNVAL_RAY_ADDRESS"
PLACEMENT_STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")
_VISIBLE = {"cuda": ("GPU", "CUDA_VISIBLE_DEVICES"), "npu": ("NPU", "ASCEND_RT_VISIBLE_DEVICES")}


class RankActor:
    """Lives on the node of one bundle; runs one rank process and hands back what it wrote."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.proc: RankProcess | None = None
        self._reported = False

    def visible_devices(self) -> dict[str, str]:
        """The visible-device variable for this actor's assigned accelerator ids (empty on CPU).

        Ray sets CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES itself for GPU/NPU resources;
        setting it from the assigned ids again keeps it right where that is switched off.
        """
        import ray

        if self.device not in _VISIBLE:
            return {}
        resource, var = _VISIBLE[self.device]
        ids = ray.get_runtime_context().get_accelerator_ids().get(resource) or []
        return {var: ",".join(str(i) for i in ids)} if ids else {}

    def node(self) -> dict[str, Any]:
        """Where this actor runs; for rank 0 also a free port for the rendezvous."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        return {
            "ip": ip,
            "port": port,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "env": {var: os.environ.get(var) for _, var in _VISIBLE.values()},
            "assigned": self.visible_devices(),
        }

    def start(
        self,
        rank: int,
        payload: Mapping[str, Any],
        env: Mapping[str, str],
        snapshot: tuple[str, bytes] | None,
        cache_dir: str | None,
    ) -> int:
        from workers.provenance import SOURCE_ROOT
        from workers.runtime import rank_environment
        from workers.snapshot import extract

        root = extract(snapshot[0], snapshot[1], cache_dir) if snapshot else SOURCE_ROOT
        child = dict(os.environ)
        child.update(
            rank_environment(
                self.device,
                deterministic=bool(payload.get("deterministic")),
                world_size=int(payload.get("world_size", 1)),
            )
        )
        child.update(env)
        child.update(self.visible_devices())
        child["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.proc = RankProcess(rank, payload, child, cwd=root, python=sys.executable)
        return self.proc.pid

    def poll(self) -> tuple[list[dict[str, Any]], int | None, str]:
        """(new messages, exit code once the rank ended, output tail once it ended)."""
        if self.proc is None:
            return [], None, ""
        msgs = self.proc.drain()
        if self.proc.exited:
            return msgs, self.proc.returncode, self.proc.output_tail()
        return msgs, None, ""

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.reap(timeout=5.0)


class RayExecutor(Executor):
    """Ranks as Ray actors in a per-job placement group.

    address: Ray cluster to join (default GDNVAL_RAY_ADDRESS; none: start a local cluster with
    `init_options`). placement_strategy: STRICT_PACK (one node, the default) | PACK | SPREAD |
    STRICT_SPREAD. repo: git repository whose commits jobs may ask for (default GDNVAL_REPO).
    cache_dir: where every node extracts snapshots (default: each node's GDNVAL_SNAPSHOT_CACHE).
    cpus_per_rank: CPUs in each rank's bundle. schedule_timeout_s: how long a job may wait for
    its placement group (capped by the job's deadline).
    """

    kind = "ray"

    def __init__(
        self,
        *,
        address: str | None = None,
        placement_strategy: str = "STRICT_PACK",
        repo: str | Path | None = None,
        cache_dir: str | Path | None = None,
        cpus_per_rank: float = 1.0,
        schedule_timeout_s: float = 60.0,
        poll_s: float = 0.25,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        if placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(
                f"unknown placement strategy {placement_strategy!r}; expected one of "
                f"{', '.join(PLACEMENT_STRATEGIES)}"
            )
        self.address = address or os.environ.get(RAY_ADDRESS_ENV) or None
        self.placement_strategy = placement_strategy
        repo = repo or os.environ.get(REPO_ENV) or None  # the service's setting, or the environment
        self.snapshots = SnapshotCache(repo, cache_dir) if repo else None
        self.cache_dir = str(cache_dir) if cache_dir else None
        self.cpus_per_rank = cpus_per_rank
        self.schedule_timeout_s = schedule_timeout_s
        self.poll_s = poll_s
        self.init_options = dict(init_options or {})
        self._actor_cls: Any = None
        self._lock = threading.Lock()

    # -- cluster ------------------------------------------------------------------------------

    def _ray(self) -> Any:
        import ray

        with self._lock:
            if not ray.is_initialized():
                if self.address:
                    ray.init(address=self.address, log_to_driver=False, **self.init_options)
                else:
                    ray.init(log_to_driver=False, **self.init_options)
            if self._actor_cls is None:
                self._actor_cls = ray.remote(RankActor)
        return ray

    def bundle(self, device: str) -> dict[str, float]:
        """The resources of one rank: its accelerator plus `cpus_per_rank` CPUs."""
        b: dict[str, float] = {"CPU": self.cpus_per_rank}
        if device == "cuda":
            b["GPU"] = 1
        elif device == "npu":
            b["NPU"] = 1
        return b

    def max_world_size(self, device: str) -> int:
        if device not in DEVICE_KINDS:
            raise ValueError(f"unknown device kind {device!r}; expected one of {', '.join(DEVICE_KINDS)}")
        ray = self._ray()
        need = self.bundle(device)
        per_node = []
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            res = node.get("Resources", {})
            per_node.append(int(min(res.get(k, 0.0) // v for k, v in need.items())))
        if not per_node:
            return 0
        return max(per_node) if self.placement_strategy == "STRICT_PACK" else sum(per_node)

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

    # -- placement ----------------------------------------------------------------------------

    def _acquire(
        self, device: str, world_size: int, timeout_s: float, cancel: threading.Event | None = None
    ) -> tuple[Any, list[Any]]:
        """A ready placement group and one actor per bundle; raises TimeoutError naming the need."""
        ray = self._ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundle(device)
        pg = placement_group([dict(bundle) for _ in range(world_size)], strategy=self.placement_strategy)
        actors: list[Any] = []
        try:
            end = time.monotonic() + timeout_s
            while not pg.wait(timeout_seconds=1):  # in steps, so a cancel is not stuck behind it
                if cancel is not None and cancel.is_set():
                    raise _Cancelled()
                if time.monotonic() < end:
                    continue
                raise TimeoutError(
                    f"could not place {world_size} rank(s) of {bundle} with {self.placement_strategy} "
                    f"within {timeout_s:g} s; cluster resources: {ray.cluster_resources()}"
                )
            for rank in range(world_size):
                opts: dict[str, Any] = {
                    "num_cpus": bundle["CPU"],
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=rank
                    ),
                    "max_restarts": 0,
                    "name": None,
                }
                if device == "cuda":
                    opts["num_gpus"] = 1
                elif device == "npu":
                    opts["resources"] = {"NPU": 1}
                actors.append(self._actor_cls.options(**opts).remote(device))
            return pg, actors
        except BaseException:
            self._release(pg, actors)
            raise

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

    def placement(self, device: str, world_size: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Where `world_size` ranks of `device` would run: node, bundle and visible devices per rank.

        Places and releases real actors; for operators and the scheduling tests.
        """
        ray = self._ray()
        pg, actors = self._acquire(device, world_size, timeout_s)
        try:
            nodes = ray.get([a.node.remote() for a in actors], timeout=timeout_s)
            return [{"rank": r, "bundle": r, **n} for r, n in enumerate(nodes)]
        finally:
            self._release(pg, actors)

    # -- jobs ---------------------------------------------------------------------------------

    def run(self, spec: JobSpec, sink: JobSink, cancel: threading.Event) -> JobOutcome:
        start = time.monotonic()
        try:
            problem = check_spec(spec, self.max_world_size(spec.device))
        except ValueError as exc:
            problem = str(exc)
        if problem:
            return JobOutcome("failed", problem)
        snapshot: tuple[str, bytes] | None = None
        if self.snapshots is not None and spec.commit:
            try:
                snapshot = self.snapshots.archive(spec.commit)
            except SnapshotError as exc:
                return JobOutcome("failed", f"cannot build the source snapshot: {exc}")
            commit: str | None = snapshot[0]
        else:
            commit = source_commit()
            if spec.commit and not (commit or "").startswith(spec.commit):
                sink.log(
                    f"job asks for commit {spec.commit} but no repository is configured; "
                    f"running the installed code (commit {commit or 'unknown'})"
                )
        ray = self._ray()
        timeout = self.schedule_timeout_s
        if spec.deadline_s:
            timeout = min(timeout, spec.deadline_s)
        try:
            pg, actors = self._acquire(spec.device, spec.world_size, timeout, cancel)
        except TimeoutError as exc:
            return JobOutcome("failed", str(exc))
        except _Cancelled:
            return JobOutcome("cancelled", "cancelled while waiting for resources")
        monitor = JobMonitor(spec, sink)
        try:
            if cancel.is_set():
                return JobOutcome("cancelled", "cancelled before the ranks started")
            master = ray.get(actors[0].node.remote(), timeout=max(5.0, timeout))
            payload = rank_payload(spec, commit)
            snap_ref = ray.put(snapshot) if snapshot else None
            starts = []
            for rank, actor in enumerate(actors):
                env = {
                    "RANK": str(rank),
                    "LOCAL_RANK": "0",
                    "WORLD_SIZE": str(spec.world_size),
                    "MASTER_ADDR": master["ip"],
                    "MASTER_PORT": str(master["port"]),
                }
                starts.append(actor.start.remote(rank, payload, env, snap_ref, self.cache_dir))
            self._get_starts(ray, starts, monitor)
            return self._watch(ray, spec, actors, monitor, cancel, start)
        except Exception as exc:  # e.g. rank 0's actor died before it published its address
            return JobOutcome("failed", monitor.failure(settle=True) or f"ray executor error: {_short(exc)}")
        finally:
            self._release(pg, actors)
            monitor.flush_info()

    def _get_starts(self, ray: Any, starts: list[Any], monitor: JobMonitor) -> None:
        for rank, ref in enumerate(starts):
            try:
                ray.get(ref, timeout=120.0)
            except Exception as exc:
                monitor.rank_exited(rank, f"rank {rank} could not start: {_short(exc)}", None, "")

    def _watch(
        self,
        ray: Any,
        spec: JobSpec,
        actors: list[Any],
        monitor: JobMonitor,
        cancel: threading.Event,
        start: float,
    ) -> JobOutcome:
        reported: set[int] = set()
        while True:
            refs = {actors[r].poll.remote(): r for r in range(len(actors)) if r not in reported}
            if refs:
                ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=10.0)
                for ref in ready:
                    rank = refs[ref]
                    try:
                        msgs, rc, tail = ray.get(ref)
                    except Exception as exc:  # the actor itself died (node lost, killed, OOM)
                        reported.add(rank)
                        monitor.rank_exited(rank, f"rank {rank} actor died: {_short(exc)}", None, "")
                        continue
                    for msg in msgs:
                        monitor.handle(rank, msg)
                    if rc is not None:
                        reported.add(rank)
                        monitor.rank_exited(rank, f"rank {rank} {describe_exit(rc)}", rc, tail)
            outcome = monitor.outcome(cancel.is_set(), len(reported), start)
            if outcome is not None:
                return outcome
            cancel.wait(self.poll_s)


class _Cancelled(Exception):
    pass


def _short(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."
