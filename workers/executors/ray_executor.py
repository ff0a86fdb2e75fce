"""Runs a job's ranks on a Ray cluster: one actor per rank, one placement group per job.

This is the Ray driver's side: it runs where `ray.init` may run, in the driver process
(`workers.executors.ray_driver`), never in the service (`workers.executors.ray_remote`). The
rank actor is `ray_actor`, capacity and placement groups `ray_placement`, watching the ranks
`ray_watch`, the code the ranks run `job_sources`.

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
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.backend_source import INSTALL_TIMEOUT_S, BackendSource
from workers.executors._monitor import JobMonitor
from workers.executors._process import SHIP_PREFIX, remove_stale_folders
from workers.executors.base import (
    Executor,
    ExecutorUnavailable,
    JobOutcome,
    JobSink,
    JobSpec,
    check_placement,
)
from workers.executors.job_sources import JobSources, prepare_sources, untar_tree
from workers.executors.local import check_spec, rank_payload
from workers.executors.ray_actor import RankActor
from workers.executors.ray_placement import CPU_NODE_RESOURCE, Cancelled, RayPlacement
from workers.executors.ray_watch import RankWatch, get_starts, on_node, rank_extra, short
from workers.snapshot import REPO_ENV, SnapshotCache, SnapshotError, extract

RAY_ADDRESS_ENV = "GDNVAL_RAY_ADDRESS"
PROBE_TIMEOUT_S = 2.0  # how long a readiness probe waits for the cluster's GCS
# what readiness places: a sliver of the resource only the head node has, so a busy cluster
# still answers and nothing a job needs is taken
READINESS_BUNDLE = {"node:__internal_head__": 0.001}
READINESS_PLACEMENT_S = 5.0
UNAVAILABLE_GRACE_S = 30.0  # how long an actor Ray calls unavailable (maybe transient) may stay so


class RayExecutor(RayPlacement, Executor):
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
        remove_stale_folders()  # what a killed driver staged on this machine
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
                            f"cannot join the Ray cluster at {self.address}: {short(exc)}"
                        ) from exc
                else:
                    ray.init(log_to_driver=False, **self.init_options)
            if self._actor_cls is None:
                self._actor_cls = ray.remote(RankActor)
        return ray

    def connect(self) -> tuple[str, str]:
        """Join the cluster at `address` (or start the local one) now: (its GCS address, the node
        id of this driver), what `lost` compares against later."""
        ctx = self._ray().get_runtime_context()
        return str(ctx.gcs_address), str(ctx.get_node_id())

    def _probe(self, address: str | None = None) -> list[dict[str, Any]]:
        """The alive nodes (id and total resources) of the cluster whose GCS is at `address`
        (default the configured one), asked of the GCS directly by a client made for this call
        (one kept across a restart of the cluster would refuse the new cluster's id), within
        `PROBE_TIMEOUT_S`, without joining as a driver; ExecutorUnavailable naming the address
        and the error otherwise."""
        from ray._raylet import GcsClient

        address = address or str(self.address)
        try:
            host, _, port = address.rpartition(":")
            # a new GcsClient waits tens of seconds for a GCS that is not there: knock first
            socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
            infos = GcsClient(address=address).get_all_node_info(timeout=PROBE_TIMEOUT_S)
        except Exception as exc:
            raise ExecutorUnavailable(f"the Ray cluster at {address} is unreachable: {short(exc)}") from exc
        return [
            {"node_id": i.node_id.hex(), "resources": dict(i.resources_total)}
            for i in infos.values() if i.state == 0  # GcsNodeState.ALIVE
        ]

    def _node_ids(self) -> set[str]:
        """The alive nodes of the cluster this driver joined, asked of its GCS now."""
        gcs = str(self._ray().get_runtime_context().gcs_address)
        return {n["node_id"] for n in self._probe(gcs)}

    def cluster(self, gcs_address: str | None = None) -> dict[str, Any]:
        """Alive nodes and resources per kind of the cluster (at `gcs_address`, default the
        configured address); a local cluster not started yet (it starts with the first job)
        reports no nodes."""
        import ray

        if self.address or gcs_address:
            nodes = self._probe(gcs_address)
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
        return {"address": self.address or "local", "nodes": len(nodes), "resources": totals,
                "node_ids": sorted(n["node_id"] for n in nodes)}

    def check_placement(self, timeout_s: float = READINESS_PLACEMENT_S) -> None:
        """Place a one-bundle group on the head node and remove it: the proof that this driver
        can place work now (its GCS, its raylet and the scheduler answer); ExecutorUnavailable
        saying what did not."""
        from ray.util.placement_group import placement_group, remove_placement_group

        self._ray()
        pg = placement_group([dict(READINESS_BUNDLE)], name="gdnval-readiness")
        try:
            if not pg.wait(timeout_seconds=timeout_s):
                raise ExecutorUnavailable(f"a placement group of {READINESS_BUNDLE} was not placed within "
                                          f"{timeout_s:g} s")
        finally:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

    def _ship(self, sources: JobSources) -> tuple[dict[str, Any], dict[str, str]]:
        """Stage the snapshot as `<tmp>/<sha>/` and the backend source's unbuilt tree as
        `<tmp>/backend-src-<key>/`, upload `<tmp>` to the cluster as a working_dir package and
        delete the staging copy: (runtime_env for the actors, what to record)."""
        from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

        stage = Path(tempfile.mkdtemp(prefix=f"{SHIP_PREFIX}-p{os.getpid()}-"))
        shipped: dict[str, str] = {}
        try:
            (stage / "tree").mkdir()
            if sources.snapshot is not None:
                extract(sources.snapshot[0], sources.snapshot[1], stage / "tree")
                shipped["commit"] = sources.snapshot[0]
            if sources.backend_tar is not None:
                shipped["backend_tree"] = f"backend-src-{sources.backend_key}"
                untar_tree(sources.backend_tar, stage / "tree" / shipped["backend_tree"])
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
        sources = prepare_sources(spec, self.snapshots, self.backend_cache, sink, cancel)
        if isinstance(sources, JobOutcome):
            return sources
        return self.run_prepared(spec, sources, sink, cancel)

    def run_prepared(self, spec: JobSpec, sources: JobSources, sink: JobSink,
                     cancel: threading.Event) -> JobOutcome:
        """Run the job on the code `prepare_sources` made ready (where the service runs)."""
        start = time.monotonic()
        try:
            strategy = check_placement(spec.placement or self.placement_strategy)
            problem = check_spec(spec, self.most_ranks(spec.device, strategy))
        except ValueError as exc:
            problem = str(exc)
        if problem:
            return JobOutcome("failed", problem)
        runtime_env: dict[str, Any] | None = None
        backend_tree_dir: str | None = None
        if sources.snapshot is not None or sources.backend_tar is not None:
            what = "the source snapshot" if sources.backend_tar is None else \
                "the source snapshot and the backend source"
            try:
                self._ray()
                runtime_env, shipped = self._ship(sources)
            except SnapshotError as exc:
                return JobOutcome("failed", f"cannot build the source snapshot: {exc}")
            except Exception as exc:
                return JobOutcome("failed", f"cannot ship {what} to the cluster: {short(exc)}")
            backend_tree_dir = shipped.get("backend_tree")
            sink.info({"snapshot": shipped})
        sha = sources.snapshot[0] if sources.snapshot is not None else None
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
        except Cancelled:
            return JobOutcome("cancelled", "cancelled while waiting for resources")
        monitor = JobMonitor(spec, sink)
        nodes: list[dict[str, Any]] = []
        try:
            if cancel.is_set():
                return JobOutcome("cancelled", "cancelled before the ranks started")
            nodes = ray.get([a.node.remote() for a in actors], timeout=max(5.0, timeout))
            monitor.rank_extras = {r: rank_extra(n) for r, n in enumerate(nodes)}
            sink.info({"placement": strategy, "distinct_nodes": len({n["node_id"] for n in nodes})})
            backend_dirs: list[str | None] = [None] * len(actors)
            if spec.backend_source:
                installed = self._install_backend(ray, spec, sources.backend_key, backend_tree_dir, actors,
                                                  nodes, cancel, sink)
                if isinstance(installed, JobOutcome):
                    return installed
                backend_dirs = [i["path"] for i in installed]
            master = nodes[0]
            payload = rank_payload(spec, sources.commit)
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
            get_starts(ray, starts, monitor, nodes)
            return RankWatch(ray, actors, monitor, nodes, self.unavailable_grace_s, self._node_ids).run(
                cancel, start, self.poll_s)
        except Exception as exc:  # e.g. an actor died before it said where it runs
            return JobOutcome("failed", monitor.failure(settle=True) or f"ray executor error: {short(exc)}")
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
                                            f"{on_node(nodes, rank)}: {why[-2000:]}")
        sink.info({"backend_install": installed})
        for node in sorted({i["node_id"] for i in installed}):
            mine = [i for i in installed if i["node_id"] == node]
            built = "built" if any(i["built"] for i in mine) else "found installed"
            sink.log(f"backend source {source} {built} at {mine[0]['path']} on node {node}")
        return installed
