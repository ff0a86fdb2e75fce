"""The rank actor of the Ray executor: lives on the node of one bundle of a job's placement
group, installs the job's backend source there, starts its rank as a child process (the same
`workers.runtime` rank the local executor starts, through `workers.executors._process`) and
hands back what the rank wrote, so a rank that segfaults or kills itself leaves its actor alive
to report the exit code and output tail.

The actor runs the installed code; the rank runs the job's snapshot, which Ray unpacked into the
actor's working directory. Its environment is built from the allow-list of `workers.job_env`.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.backend_source import BackendSourceError
from workers.executors._process import RankProcess, remove_stale_folders
from workers.job_env import SECRETS, job_environment, job_user

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
    """Lives on the node of one bundle; runs one rank process and hands back what it wrote.

    Started with `max_concurrency=CONCURRENCY`, so `kill` runs while `install_backend` still
    builds: it stops the build (its whole process group) as well as the rank."""

    CONCURRENCY = 2

    def __init__(self, device: str, label: str = "") -> None:
        for name in SECRETS:  # a cluster started by the service copied its environment to us
            os.environ.pop(name, None)
        self.device = device
        self.proc: RankProcess | None = None
        self._reported = False
        self.label = label
        self._stop = threading.Event()  # set by `kill`: an install in progress ends
        remove_stale_folders()  # what ranks of a killed actor left on this node
        self.user = job_user()  # the node's GDNVAL_JOB_USER: who job code runs as here

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
            "host": socket.gethostname(),
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
            folder, built = install_backend_tree(source, key, src, cache_dir, sys.executable, self._stop,
                                                 self.user)
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

        if self._stop.is_set():
            raise RuntimeError("the actor was stopped before its rank started")
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
        self.proc = RankProcess(rank, payload, child, cwd=root, python=sys.executable, user=self.user)
        return self.proc.pid

    def poll(self) -> tuple[list[dict[str, Any]], int | None, str, float]:
        """(new messages, exit code once the rank ended, output tail once it ended, seconds the
        rank has been silent: `RankProcess.silent_s`)."""
        if self.proc is None:
            return [], None, "", 0.0
        msgs = self.proc.drain()
        if self.proc.exited:
            return msgs, self.proc.returncode, self.proc.output_tail(), 0.0
        return msgs, None, "", self.proc.silent_s

    def kill(self) -> None:
        self._stop.set()
        if self.proc is not None:
            self.proc.reap(timeout=5.0)

