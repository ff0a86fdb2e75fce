"""Executors that run a job's ranks: `local` (child processes) and `ray` (one actor per rank, run
by a driver process of its own: `workers.executors.ray_remote`).

`make_executor(kind, **options)` is what the service and the CLI call; neither module imports
torch or ray at import time, so choosing an executor costs nothing on a head node.
"""

from __future__ import annotations

from typing import Any

from workers.executors.base import Executor

EXECUTOR_KINDS: tuple[str, ...] = ("local", "ray")


def make_executor(kind: str, **options: Any) -> Executor:
    """A new executor of `kind` ("local" or "ray") configured with `options`."""
    if kind == "local":
        from workers.executors.local import LocalExecutor

        return LocalExecutor(**options)
    if kind == "ray":
        from workers.executors.ray_remote import RayDriverExecutor

        return RayDriverExecutor(**options)
    raise ValueError(f"unknown executor kind {kind!r}; expected one of {', '.join(EXECUTOR_KINDS)}")
