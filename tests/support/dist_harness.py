"""Run a function in N local gloo processes and collect each rank's result.

    results = run_distributed(fn, world_size=2, args=(cfg,))   # fn(rank, world_size, *args)

`fn` must be importable (a module-level function): ranks are forked from a server process that
imported torch once (multiprocessing's forkserver), then import `fn`'s module and run in the
caller's current environment. Each rank joins a gloo group on a free local port with a timeout;
results travel back pickled (tensors are moved to CPU, fp64 stays fp64). A rank that raises
fails the call with that rank's traceback; a rank that hangs past `timeout_s` fails it too and
every process is terminated.
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.ports import free_port


class DistributedRunError(RuntimeError):
    """A rank raised, died or timed out; the message carries which and why."""


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _entry(
    env: dict[str, str],
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    queue: Any,
    timeout_s: float,
    threads: int,
) -> None:
    os.environ.clear()  # the caller's, not the fork server's from when it started
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
        try:
            result = _to_cpu(fn(rank, world_size, *args))
            queue.put((rank, True, pickle.dumps(result)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # report every failure to the parent, with its traceback
        queue.put((rank, False, traceback.format_exc()))


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    *,
    timeout_s: float = 120.0,
    threads_per_rank: int = 1,
) -> list[Any]:
    """`[fn(0, world_size, *args), ..., fn(world_size-1, world_size, *args)]`, each in its own process."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_entry,
            args=(dict(os.environ), r, world_size, port, fn, args, queue, timeout_s, threads_per_rank),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            try:
                # After a failure, give the other ranks a moment to report their own cause.
                rank, ok, payload = queue.get(timeout=(timeout_s + 30) if not errors else 5)
            except Exception as exc:  # queue.Empty: some rank hung or died without reporting
                if errors:
                    break
                missing = sorted(set(range(world_size)) - set(results))
                raise DistributedRunError(
                    f"ranks {missing} did not finish within {timeout_s + 30:.0f} s "
                    f"(exit codes {[p.exitcode for p in procs]}); errors so far: {errors}"
                ) from exc
            if ok:
                results[rank] = pickle.loads(payload)
            else:
                errors.append(f"rank {rank}:\n{payload}")
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    if errors:
        raise DistributedRunError("\n".join(errors))
    return [results[r] for r in range(world_size)]
