"""Which executor the service runs jobs with, from its settings.

`local` and `ray` come from `workers.executors.make_executor` (both run every job, CPU ones
included, through the same rank runtime, so one verdict rule judges them all); a
`package.module:factory` path names any other factory (plugins, tests). One executor per
settings is shared by the dispatcher (runs jobs) and the API (asks `max_world_size`).
"""

from __future__ import annotations

import importlib
import json
import threading
from typing import TYPE_CHECKING, Any

from workers.executors import make_executor
from workers.executors.base import Executor

if TYPE_CHECKING:
    from service.settings import Settings

_lock = threading.Lock()
_cache: dict[tuple[Any, ...], Executor] = {}


def build_executor(settings: Settings) -> Executor:
    """A new executor for `settings.executor` (see the module docstring for the kinds)."""
    kind = settings.executor
    if ":" in kind:
        module, _, attr = kind.partition(":")
        return getattr(importlib.import_module(module), attr)()
    options: dict[str, Any] = {}
    if kind == "ray":
        options = {"address": settings.ray_address, "driver": settings.ray_driver,
                   "placement_strategy": settings.placement,
                   "cpu_node_resource": settings.ray_cpu_resource,
                   "max_nodes": settings.ray_max_resources,
                   "node_wait_s": settings.ray_node_wait_s}
    return make_executor(kind, **options)


def get_executor(settings: Settings) -> Executor:
    """The shared executor for these settings (built on first use)."""
    key = (settings.executor, settings.ray_address, settings.ray_driver, settings.placement,
           settings.ray_cpu_resource,
           json.dumps(settings.ray_max_resources, sort_keys=True), settings.ray_node_wait_s)
    with _lock:
        if key not in _cache:
            _cache[key] = build_executor(settings)
        return _cache[key]


def close_executors() -> None:
    with _lock:
        for ex in _cache.values():
            ex.close()
        _cache.clear()
