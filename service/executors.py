"""Which executor the service runs jobs with, from its settings.

`local` and `ray` come from `workers.executors.make_executor`; `inprocess` runs a job's cases in
this process on one CPU rank (no child processes: for tiny machines and the demo); a
`package.module:factory` path names any other factory (plugins, tests). One executor per
settings is shared by the dispatcher (runs jobs) and the API (asks `max_world_size`).
"""

from __future__ import annotations

import importlib
import threading
import traceback
from typing import TYPE_CHECKING, Any

from workers.executor import Executor, JobOutcome, JobSink, JobSpec
from workers.registry import get_suite
from workers.suite import Sample

if TYPE_CHECKING:
    from service.settings import Settings

_lock = threading.Lock()
_cache: dict[tuple[str, str | None, str, str | None], Executor] = {}


def build_executor(settings: Settings) -> Executor:
    """A new executor for `settings.executor` (see the module docstring for the kinds)."""
    kind = settings.executor
    if kind == "inprocess":
        return InProcessExecutor()
    if ":" in kind:
        module, _, attr = kind.partition(":")
        return getattr(importlib.import_module(module), attr)()
    from workers.executors import make_executor

    options: dict[str, Any] = {}
    if kind == "ray":
        options = {"address": settings.ray_address, "placement_strategy": settings.placement,
                   "cpu_node_resource": settings.ray_cpu_resource}  # fmt: skip
    return make_executor(kind, **options)


def get_executor(settings: Settings) -> Executor:
    """The shared executor for these settings (built on first use)."""
    key = (settings.executor, settings.ray_address, settings.placement, settings.ray_cpu_resource)
    with _lock:
        if key not in _cache:
            _cache[key] = build_executor(settings)
        return _cache[key]


def close_executors() -> None:
    with _lock:
        for ex in _cache.values():
            ex.close()
        _cache.clear()


class InProcessExecutor(Executor):
    """Runs every case on rank 0 of a world of 1 on CPU, in the calling thread."""

    kind = "inprocess"

    def max_world_size(self, device: str) -> int:
        return 1 if device == "cpu" else 0

    def run(self, spec: JobSpec, sink: JobSink, cancel: threading.Event) -> JobOutcome:
        if spec.device != "cpu" or spec.world_size != 1:
            return JobOutcome(
                "failed", f"the inprocess executor runs cpu x 1 only, got {spec.device} x {spec.world_size}"
            )
        import platform

        import torch

        from workers.context import RankContext

        suite = get_suite(spec.suite)
        cases = suite.cases(suite.resolve_params(spec.preset, spec.params))
        sink.info({
            "executor": self.kind, "device_name": platform.processor() or platform.machine(),
            "torch": torch.__version__, "python": platform.python_version(),
        })  # fmt: skip
        ctx = RankContext(rank=0, world_size=1, device=torch.device("cpu"), device_kind="cpu",
                          deterministic=spec.deterministic)  # fmt: skip
        for i, case in enumerate(cases):
            if cancel.is_set():
                return JobOutcome("cancelled")
            sink.progress(i, len(cases), case.name)
            batch: list[Sample] = []
            try:
                for sample in suite.run(ctx, case):
                    batch.append(sample)
                    if len(batch) >= 1000:
                        sink.samples(batch)
                        batch = []
                sink.samples(batch)
                sink.case_result(case.name, "passed")
            except Exception as exc:
                sink.samples(batch)
                if case.expected_error and type(exc).__name__ == case.expected_error:
                    sink.case_result(case.name, "expected_error", f"{type(exc).__name__}: {exc}")
                else:
                    sink.case_result(case.name, "error", traceback.format_exc(limit=5)[-4000:])
        sink.progress(len(cases), len(cases), "done")
        return JobOutcome("succeeded")
