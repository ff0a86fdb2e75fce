"""Runs a job's ranks on a Ray cluster: one actor per rank, one placement group per job.

Each actor holds its rank's device as a Ray resource (`num_gpus=1` for CUDA, `{"NPU": 1}` for
Ascend, CPUs otherwise) and starts the rank as a child process (`python -m workers.runtime`, the
same runtime the local executor uses), so a rank that segfaults or kills itself leaves its actor
alive to report the exit code and output tail. The executor polls every actor for the channel
messages its rank wrote, so samples reach the sink while the job runs.

Placement: the job's placement group uses the job's strategy (label `placement`) or the
executor's (PACK by default). Capacity is counted per alive node, over every node: "ever" from
the nodes' totals (a job that can never fit is refused at submit), "now" from what is free (the
dispatcher claims only jobs that fit now, so a full pool of one device kind leaves the others
running). CPU ranks ask for the marker resource `cpu_node` as well, so they only land on nodes
started with it and never take the CPUs a GPU/NPU node keeps for its accelerator ranks.

The code under test is the job's commit: with a configured repository the driver archives the
commit (`git archive`), stages the tree as `<dir>/<sha>/` and ships `<dir>` as the actors'
runtime environment (`working_dir`: Ray zips it into its object store under a content hash and
every node downloads and unpacks it once per hash), so worker nodes need no checkout. The rank
imports from `<sha>/`; the actor itself runs the installed code (the snapshot is one level down,
not on its import path), so an old commit cannot break the harness that reports on it.

A job naming a backend source (label `backend_source`: a git repository at a commit, or a
requirement) has it built where its ranks run, never on the driver (the service host may have
neither the job's torch nor its accelerator, and a compiled backend must be built for the node's
machine). The driver only fetches a git source and ships the commit's tree, unbuilt, in the same
working_dir as `<dir>/backend-src-<key>/`; a requirement travels as its text. Before the ranks
start, each rank's actor installs it on its node (workers.backend_source with
workers.backend_install: isolated build, dependencies from the node's environment) into the
node's backend cache (`node_backend_cache`, else the node's `GDNVAL_BACKEND_CACHE` or its
default), keyed by the commit or the requirement's hash, so a node builds each source once and
ranks sharing a node wait for one build. The rank puts the installed folder on its path after
the source root, as the local executor does. A source that cannot be fetched, shipped or built
fails the job, naming it (and the node, for a build).

`import ray` happens on first use, never at import time (the service imports this lazily too).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workers.backend_source import INSTALL_TIMEOUT_S, BackendSource, BackendSourceError, backend_tree
from workers.executors._monitor import JobMonitor
from workers.executors._process import RankProcess, describe_exit
from workers.executors.base import (
    Executor,
    ExecutorUnavailable,
    JobOutcome,
    JobSink,
    JobSpec,
    check_placement,
)
from workers.executors.local import DEVICE_KINDS, check_spec, rank_payload
from workers.job_env import SECRETS, job_environment
from workers.provenance import source_commit
from workers.snapshot import REPO_ENV, SnapshotCache, SnapshotError, extract

RAY_ADDRESS_ENV = "GDNVAL_RAY_ADDRESS"
CPU_NODE_RESOURCE = "cpu_node"  # marker resource of the nodes that take CPU ranks
CPU_NODE_SHARE = 0.001  # what one CPU rank asks of it: a marker, the CPUs bound the count
JOB_ID_ENV = "GDNVAL_JOB_ID"  # in every rank actor's runtime_env: Ray's view names the job
PROBE_TIMEOUT_S = 2.0  # how long a readiness probe waits for the cluster's GCS
PLACEMENT_QUIET_S = 5.0  # a group that fits the free resources but waits longer is reported waiting
UNAVAILABLE_GRACE_S = 30.0  # how long an actor Ray calls unavailable (maybe transient) may stay so
_VISIBLE = {"cuda": ("GPU", "CUDA_VISIBLE_DEVICES"), "npu": ("NPU", "ASCEND_RT_VISIBLE_DEVICES")}


def actor_rank_env(
    device: str, payload: Mapping[str, Any], env: Mapping[str, str], visible: Mapping[str, str],
    paths: list[str], base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A Ray rank's environment: the allow-listed part of the actor's (`base`, default its own,
    which Ray copies from the service that started the cluster: secrets included), the rank
    variables, the rendezvous `env`, the assigned devices and `paths` ahead of PYTHONPATH."""
    from workers.runtime import rank_environment

    base = os.environ if base is None else base
    child = job_environment(base)
    child.update(
        rank_environment(
            device,
            deterministic=bool(payload.get("deterministic")),
            world_size=int(payload.get("world_size", 1)),
            base_env=child,
        )
    )
    child.update(env)
    child.update(visible)
    child["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [base.get("PYTHONPATH")])])
    return child


class RankActor:
    """Lives on the node of one bundle; runs one rank process and hands back what it wrote."""

    def __init__(self, device: str, label: str = "") -> None:
        for name in SECRETS:  # a cluster started by the service copied its environment to us
            os.environ.pop(name, None)
        self.device = device
        self.proc: RankProcess | None = None
        self._reported = False
        self.label = label

    def __repr__(self) -> str:
        """Ray shows this as the actor's name in its logs' prefix and in `ray list actors`."""
        return self.label or "RankActor"

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
        """Where this actor runs; also a free port there, which rank 0's actor offers for the
        rendezvous."""
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

    def install_backend(
        self, source: str, key: str, tree: str | None, cache_dir: str | None
    ) -> dict[str, Any]:
        """Build and install the job's backend source on this node for this actor's interpreter:
        from `tree` (the unbuilt commit Ray unpacked into this actor's cwd) for a git source, else
        from the requirement, into the node's cache (`cache_dir`, else the node's default) under
        `key`. Says where, by which process, and whether this call built it or found it built."""
        import ray

        from workers.backend_source import install_backend_tree

        src = Path.cwd() / tree if tree else None
        t0 = time.monotonic()
        try:
            folder, built = install_backend_tree(source, key, src, cache_dir, sys.executable)
        except BackendSourceError as exc:  # a plain error: Ray wraps it with the actor's traceback
            raise RuntimeError(str(exc)) from None
        return {"path": str(folder), "built": built, "seconds": round(time.monotonic() - t0, 3),
                "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def start(
        self, rank: int, payload: Mapping[str, Any], env: Mapping[str, str], sha: str | None,
        backend_dir: str | None = None,
    ) -> int:
        """Start the rank; with `sha` it runs the snapshot Ray unpacked into this actor's cwd, with
        `backend_dir` the backend source installed on this node (`install_backend`) goes on its
        path."""
        from workers.provenance import SOURCE_ROOT
        from workers.snapshot import COMPLETE_MARKER

        if sha:
            root = Path.cwd() / sha
            if not (root / COMPLETE_MARKER).is_file():
                raise RuntimeError(
                    f"the runtime environment holds no snapshot of {sha} (cwd {Path.cwd()})"
                )
        else:
            root = SOURCE_ROOT
        paths = [str(root)]
        if backend_dir:
            if not Path(backend_dir).is_dir():
                raise RuntimeError(f"no installed backend folder {backend_dir} on this node")
            paths.append(backend_dir)
        child = actor_rank_env(self.device, payload, env, self.visible_devices(), paths)
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


class RayExecutor(Executor):
    """Ranks as Ray actors in a per-job placement group.

    address: Ray cluster to join (default GDNVAL_RAY_ADDRESS; none: start a local cluster with
    `init_options`, its one node marked for CPU ranks). placement_strategy: PACK (the default) |
    SPREAD | STRICT_PACK | STRICT_SPREAD; a job's `placement` overrides it. cpu_node_resource:
    the marker resource CPU ranks ask for (None: CPU ranks may land on any node). repo: git
    repository whose commits jobs may ask for (default GDNVAL_REPO). backend_cache: where the
    driver keeps the backend sources it fetches (default workers.backend_source's);
    node_backend_cache: where each node installs them (a path on the nodes; default the node's
    GDNVAL_BACKEND_CACHE, else its user cache). cpus_per_rank: CPUs in each
    rank's bundle. unavailable_grace_s: how long a rank's actor may stay unavailable (Ray's
    ActorUnavailableError, possibly transient) before the rank is failed. schedule_timeout_s:
    how long a claimed job may wait for its placement group
    (capped by the job's deadline). max_nodes: the resources of each node the cluster may grow
    to (its autoscaler's maximum): a job that fits them is accepted, and while it waits for
    nodes the autoscaler is asked for its bundles (`request_resources`), for up to
    `node_wait_s` (capped by the job's deadline); the request is withdrawn once it is placed,
    cancelled or given up.
    """

    kind = "ray"

    def __init__(
        self,
        *,
        address: str | None = None,
        placement_strategy: str = "PACK",
        cpu_node_resource: str | None = CPU_NODE_RESOURCE,
        repo: str | Path | None = None,
        backend_cache: str | Path | None = None,
        node_backend_cache: str | None = None,
        cpus_per_rank: float = 1.0,
        schedule_timeout_s: float = 60.0,
        poll_s: float = 0.25,
        init_options: Mapping[str, Any] | None = None,
        max_nodes: list[Mapping[str, float]] | None = None,
        node_wait_s: float = 600.0,
        unavailable_grace_s: float = UNAVAILABLE_GRACE_S,
    ) -> None:
        if cpus_per_rank <= 0:
            raise ValueError(f"cpus_per_rank must be > 0 (a rank's bundle holds CPUs), got {cpus_per_rank}")
        self.address = address or os.environ.get(RAY_ADDRESS_ENV) or None
        self.placement_strategy = check_placement(placement_strategy)
        self.cpu_node_resource = cpu_node_resource
        repo = repo or os.environ.get(REPO_ENV) or None  # the service's setting, or the environment
        self.snapshots = SnapshotCache(repo) if repo else None
        self.backend_cache = Path(backend_cache) if backend_cache else None  # the driver's: repos, trees
        self.node_backend_cache = node_backend_cache  # a path on the nodes; None: each node's default
        self.cpus_per_rank = cpus_per_rank
        self.schedule_timeout_s = schedule_timeout_s
        self.poll_s = poll_s
        self.init_options = dict(init_options or {})
        if not self.address and cpu_node_resource:  # the local cluster's one node takes CPU ranks
            resources = dict(self.init_options.get("resources") or {})
            resources.setdefault(cpu_node_resource, 1.0)
            self.init_options["resources"] = resources
        self._actor_cls: Any = None
        self._gcs: Any = None  # the readiness probe's GCS client, made on first use
        self.max_nodes = [dict(n) for n in max_nodes or []]
        self.node_wait_s = node_wait_s
        self.unavailable_grace_s = unavailable_grace_s
        self._demand: dict[int, list[dict[str, float]]] = {}  # token -> bundles asked of the autoscaler
        self._lock = threading.Lock()
        self._unplaced: dict[int, tuple[str, int]] = {}  # run id -> (device, ranks) not yet placed

    # -- cluster ------------------------------------------------------------------------------

    def _ray(self) -> Any:
        import ray

        with self._lock:
            if not ray.is_initialized():
                if self.address:
                    self._probe()  # fail in seconds, not after ray.init's own long wait
                    try:
                        ray.init(address=self.address, log_to_driver=False, **self.init_options)
                    except Exception as exc:
                        raise ExecutorUnavailable(
                            f"cannot join the Ray cluster at {self.address}: {_short(exc)}"
                        ) from exc
                else:
                    ray.init(log_to_driver=False, **self.init_options)
            if self._actor_cls is None:
                self._actor_cls = ray.remote(RankActor)
        return ray

    def _probe(self) -> list[dict[str, Any]]:
        """The alive nodes of the cluster at `address` (id and total resources), asked of its GCS
        directly with the process's Ray credentials, within `PROBE_TIMEOUT_S`, without joining
        it as a driver; ExecutorUnavailable naming the address and the error otherwise."""
        from ray._raylet import GcsClient

        try:
            host, _, port = str(self.address).rpartition(":")
            # a new GcsClient waits tens of seconds for a GCS that is not there: knock first
            socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
            if self._gcs is None:
                self._gcs = GcsClient(address=str(self.address))
            infos = self._gcs.get_all_node_info(timeout=PROBE_TIMEOUT_S)
        except Exception as exc:
            raise ExecutorUnavailable(
                f"the Ray cluster at {self.address} is unreachable: {_short(exc)}"
            ) from exc
        return [
            {"node_id": i.node_id.hex(), "resources": dict(i.resources_total)}
            for i in infos.values() if i.state == 0  # GcsNodeState.ALIVE
        ]

    def cluster(self) -> dict[str, Any]:
        """Alive nodes and resources per kind of the cluster; a local cluster not started yet
        (it starts with the first job) reports no nodes."""
        import ray

        if self.address:
            nodes = self._probe()
        elif ray.is_initialized():
            nodes = [{"node_id": n["NodeID"], "resources": dict(n.get("Resources") or {})}
                     for n in ray.nodes() if n.get("Alive")]
        else:
            return {"address": "local, started with the first job", "nodes": 0, "resources": {}}
        totals: dict[str, float] = {}
        for node in nodes:
            for kind, amount in node["resources"].items():
                if not kind.startswith("node:") and kind not in ("memory", "object_store_memory"):
                    totals[kind] = totals.get(kind, 0.0) + float(amount)
        return {"address": self.address or "local", "nodes": len(nodes), "resources": totals}

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

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

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
                    raise _Cancelled()
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

    def _ship(
        self, snapshot: tuple[str, bytes] | None, backend: tuple[str, Path] | None = None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Stage the snapshot as `<tmp>/<sha>/` and the backend source's unbuilt tree (key, tree)
        as `<tmp>/backend-src-<key>/`, upload `<tmp>` to the cluster as a working_dir package and
        delete the staging copy: (runtime_env for the actors, what to record)."""
        from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

        stage = Path(tempfile.mkdtemp(prefix="gdnval-ship-"))
        shipped: dict[str, str] = {}
        try:
            (stage / "tree").mkdir()
            if snapshot is not None:
                extract(snapshot[0], snapshot[1], stage / "tree")
                shipped["commit"] = snapshot[0]
            if backend is not None:
                shipped["backend_tree"] = f"backend-src-{backend[0]}"
                shutil.copytree(backend[1], stage / "tree" / shipped["backend_tree"], symlinks=True)
            env = upload_working_dir_if_needed(
                {"working_dir": str(stage / "tree")}, include_gitignore=False, scratch_dir=str(stage)
            )
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        uri = str(env["working_dir"])
        digest = uri.rsplit("_ray_pkg_", 1)[-1].removesuffix(".zip")
        return {"working_dir": uri}, {**shipped, "runtime_env_uri": uri, "content_hash": digest}

    # -- jobs ---------------------------------------------------------------------------------

    def run(self, spec: JobSpec, sink: JobSink, cancel: threading.Event) -> JobOutcome:
        start = time.monotonic()
        try:
            strategy = check_placement(spec.placement or self.placement_strategy)
            problem = check_spec(spec, self.most_ranks(spec.device, strategy))
        except ValueError as exc:
            problem = str(exc)
        if problem:
            return JobOutcome("failed", problem)
        backend: tuple[str, Path] | None = None  # a git backend source's (key, unbuilt tree)
        backend_key = ""
        if spec.backend_source:  # never run the job without the code it names
            try:
                backend_key, tree = backend_tree(spec.backend_source, self.backend_cache)
            except BackendSourceError as exc:
                return JobOutcome("failed", f"cannot install the backend source: {exc}")
            if tree is not None:
                backend = (backend_key, tree)
            how = "its source shipped" if tree is not None else "the requirement"
            sink.log(f"backend source {spec.backend_source}: {how} to the ranks, built on their nodes")
        runtime_env: dict[str, Any] | None = None
        sha: str | None = None
        backend_tree_dir: str | None = None
        snapshot = None
        if (self.snapshots is not None and spec.commit) or backend is not None:
            what = "the source snapshot" if backend is None else "the source snapshot and the backend source"
            try:
                if self.snapshots is not None and spec.commit:
                    snapshot = self.snapshots.archive(spec.commit)
                self._ray()
                runtime_env, shipped = self._ship(snapshot, backend)
            except SnapshotError as exc:
                return JobOutcome("failed", f"cannot build the source snapshot: {exc}")
            except Exception as exc:
                return JobOutcome("failed", f"cannot ship {what} to the cluster: {_short(exc)}")
            backend_tree_dir = shipped.get("backend_tree")
            sink.info({"snapshot": shipped})
        if snapshot is not None:
            sha = commit = snapshot[0]
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
            pg, actors = self._acquire(
                spec.device, spec.world_size, strategy, timeout, cancel, runtime_env, spec.job_id,
                waiting=lambda text: self._waiting(sink, text), deadline_s=spec.deadline_s,
            )
        except TimeoutError as exc:
            return JobOutcome("failed", str(exc))
        except _Cancelled:
            return JobOutcome("cancelled", "cancelled while waiting for resources")
        monitor = JobMonitor(spec, sink)
        nodes: list[dict[str, Any]] = []
        try:
            if cancel.is_set():
                return JobOutcome("cancelled", "cancelled before the ranks started")
            nodes = ray.get([a.node.remote() for a in actors], timeout=max(5.0, timeout))
            monitor.rank_extras = {r: _rank_extra(n) for r, n in enumerate(nodes)}
            sink.info({"placement": strategy, "distinct_nodes": len({n["node_id"] for n in nodes})})
            backend_dirs: list[str | None] = [None] * len(actors)
            if spec.backend_source:
                installed = self._install_backend(ray, spec, backend_key, backend_tree_dir, actors, nodes,
                                                  cancel, sink)
                if isinstance(installed, JobOutcome):
                    return installed
                backend_dirs = [i["path"] for i in installed]
            master = nodes[0]
            payload = rank_payload(spec, commit)
            starts = []
            for rank, actor in enumerate(actors):
                env = {
                    "RANK": str(rank),
                    "LOCAL_RANK": "0",
                    "WORLD_SIZE": str(spec.world_size),
                    "MASTER_ADDR": master["ip"],
                    "MASTER_PORT": str(master["port"]),
                }
                starts.append(actor.start.remote(rank, payload, env, sha, backend_dirs[rank]))
            self._get_starts(ray, starts, monitor, nodes)
            return self._watch(ray, spec, actors, monitor, cancel, start, nodes)
        except Exception as exc:  # e.g. an actor died before it said where it runs
            return JobOutcome("failed", monitor.failure(settle=True) or f"ray executor error: {_short(exc)}")
        finally:
            self._release(pg, actors)
            monitor.flush_info()

    @staticmethod
    def _waiting(sink: JobSink, reason: str | None) -> None:
        """Tell the sink what the job waits for (the service shows it queued) and log it; None:
        its ranks are placed and start."""
        if reason is not None:
            sink.log(reason)
        sink.waiting(reason)

    def _install_backend(
        self, ray: Any, spec: JobSpec, key: str, tree: str | None, actors: list[Any],
        nodes: list[dict[str, Any]], cancel: threading.Event, sink: JobSink,
    ) -> list[dict[str, Any]] | JobOutcome:
        """Every rank's actor installs the backend source on its node (`RankActor.install_backend`):
        what each reported, or the job's outcome when a build fails, is cancelled or outlasts the
        job's deadline."""
        assert spec.backend_source is not None
        source = str(BackendSource.parse(spec.backend_source))
        sink.progress(0, 0, f"installing backend source {source} on the ranks' nodes")
        refs = [a.install_backend.remote(source, key, tree, self.node_backend_cache) for a in actors]
        limit = spec.deadline_s or 2 * INSTALL_TIMEOUT_S
        end = time.monotonic() + limit
        pending = list(refs)
        while pending:
            if cancel.is_set():
                return JobOutcome("cancelled", "cancelled while the backend source was installed")
            if time.monotonic() > end:
                return JobOutcome("failed", f"installing the backend source {source} on the ranks' nodes "
                                            f"took longer than {limit:g} s")
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
        installed: list[dict[str, Any]] = []
        for rank, ref in enumerate(refs):
            try:
                installed.append({"rank": rank, **ray.get(ref)})
            except Exception as exc:
                why = str(getattr(exc, "cause", None) or exc)
                return JobOutcome("failed", f"cannot install the backend source for rank {rank}"
                                            f"{_on(nodes, rank)}: {why[-2000:]}")
        sink.info({"backend_install": installed})
        for node in sorted({i["node_id"] for i in installed}):
            mine = [i for i in installed if i["node_id"] == node]
            built = "built" if any(i["built"] for i in mine) else "found installed"
            sink.log(f"backend source {source} {built} at {mine[0]['path']} on node {node}")
        return installed

    def _get_starts(
        self, ray: Any, starts: list[Any], monitor: JobMonitor, nodes: list[dict[str, Any]]
    ) -> None:
        for rank, ref in enumerate(starts):
            try:
                ray.get(ref, timeout=120.0)
            except Exception as exc:
                why = f"rank {rank}{_on(nodes, rank)} could not start: {_short(exc)}"
                monitor.rank_exited(rank, why, None, "")

    def _watch(
        self,
        ray: Any,
        spec: JobSpec,
        actors: list[Any],
        monitor: JobMonitor,
        cancel: threading.Event,
        start: float,
        nodes: list[dict[str, Any]],
    ) -> JobOutcome:
        reported: set[int] = set()
        unavailable: dict[int, float] = {}  # rank -> when Ray first said its actor is unavailable
        while True:
            refs = {actors[r].poll.remote(): r for r in range(len(actors)) if r not in reported}
            if refs:
                ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=10.0)
                for ref in ready:
                    rank = refs[ref]
                    try:
                        msgs, rc, tail = ray.get(ref)
                        unavailable.pop(rank, None)
                    except Exception as exc:  # the actor itself died (node lost, killed, OOM)
                        if still_unavailable(exc, rank, unavailable, self.unavailable_grace_s):
                            continue  # Ray says it may come back: ask again next round
                        reported.add(rank)
                        monitor.rank_exited(rank, f"rank {rank}{_on(nodes, rank)} actor died: {_short(exc)}",
                                            None, "")
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


def still_unavailable(exc: BaseException, rank: int, since: dict[int, float], grace_s: float) -> bool:
    """Whether `exc` is Ray's ActorUnavailableError (the actor may be unreachable only for a
    moment) for `rank`, first seen (recorded in `since`) less than `grace_s` ago: then the call
    is retried instead of the rank being failed as dead."""
    from ray.exceptions import ActorUnavailableError

    if not isinstance(exc, ActorUnavailableError):
        return False
    first = since.setdefault(rank, time.monotonic())
    return time.monotonic() - first < grace_s


def _rank_extra(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the job info records per rank about where Ray put it."""
    return {
        "node_id": node.get("node_id"),
        "node_ip": node.get("ip"),
        "actor_pid": node.get("pid"),
        "ray_visible_devices": {k: v for k, v in (node.get("env") or {}).items() if v is not None},
    }


def _on(nodes: list[dict[str, Any]], rank: int) -> str:
    if rank >= len(nodes):
        return ""
    return f" on node {nodes[rank].get('node_id')} ({nodes[rank].get('ip')})"


class _Cancelled(Exception):
    pass


def _short(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."
