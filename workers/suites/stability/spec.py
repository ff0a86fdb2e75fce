"""`stability`: each distributed mode runs many consecutive forward+backward passes.

Per pass (idx = pass): the global loss, whether it and the grad-norm are finite, the pass time and
the full-process peak allocated (peak reset before each pass). Per case: the peak growth from
pass 2 to the last pass (bound 1 MiB: a leak of buffers or autograd graphs grows it), and the
number of point-to-point order checks the CP layer made. A message out of order raises the CP
layer's `CPCommError`; a hang becomes a `CPCommError` after `timeout_s` (the CP transfer timeout),
so the case fails with the reason instead of stalling the job.
"""

from __future__ import annotations

from typing import Any, ClassVar

from workers.suite import CPU_GATE_PRESETS, Case, Metric, Positive, Suite, SuiteParams, cp_misfit
from workers.suites.shared.spec import CP_MODES, ModelParams, case_base, check_modes_and_dtype

MIB = 1 << 20


class StabilityParams(ModelParams):
    seq_len: Positive = 64
    batch_size: Positive = 2
    valid_lengths: tuple[int, ...] | None = (64, 45)  # the padding boundary inside rank 1's shard
    checkpoint: str = "off"
    passes: Positive = 20
    timeout_s: float = 120.0


class StabilitySuite(Suite):
    name = "stability"
    gate_presets = CPU_GATE_PRESETS
    description = "consecutive fwd+bwd passes per CP mode: order, deadlock, NaN/Inf and memory growth"
    params_model = StabilityParams
    run_module = "workers.suites.stability.run"
    min_world_size = 2
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "gate-cpu": {},  # the CPU-sized passes of quick: stability has no speed verdict to sharpen
        "gate": {"model": "qwen35-4l", "seq_len": 16384, "batch_size": 1, "valid_lengths": None,
                 "dtype": "bfloat16", "backend": "triton", "corpus": "package", "modes": ("ulysses", "p2p")},
        "full": {"model": "qwen35-4l", "seq_len": 65536, "batch_size": 1, "valid_lengths": None,
                 "dtype": "bfloat16", "backend": "triton", "corpus": "package", "modes": ("ulysses", "p2p"),
                 "passes": 50},
    }
    metrics = (
        Metric("loss", "nats", "trajectory", diagnostic=True, description="global loss of each pass"),
        Metric("finite", "bool", "check", "higher", bound=1.0,
               description="loss and grad-norm finite, per pass"),
        Metric("pass_ms", "ms", "time", description="wall time of each fwd+bwd pass"),
        Metric("peak_allocated_bytes", "bytes", "memory",
               description="full-process peak allocated, per pass"),
        Metric("memory_growth_bytes", "bytes", "memory", bound=float(MIB),
               description="peak allocated of the last pass minus that of pass 2 (bound 1 MiB)"),
        Metric("order_checks", "count", "check", "higher",
               description="point-to-point messages whose sequence number the CP layer checked"),
        Metric("passes_done", "count", "check", "higher",
               description="consecutive passes completed (the case's `passes` when it passes)"),
    )

    def misfit(self, case: Case, world_size: int) -> str | None:
        return cp_misfit(case.params, world_size)

    def time_repeats(self, params: SuiteParams) -> int:
        assert isinstance(params, StabilityParams)
        return params.passes

    def backends(self, params: SuiteParams) -> tuple[str, ...]:
        assert isinstance(params, StabilityParams)
        return (params.backend,)

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, StabilityParams)
        check_modes_and_dtype(params.modes, CP_MODES[1:], params.dtype, what="distributed CP mode")
        if params.passes < 2:
            raise ValueError(f"passes must be >= 2 (growth is measured from pass 2), got {params.passes}")
        base = case_base(params, {"modes"})
        return [Case(self.name, f"passes/{m}", {**base, "mode": m}) for m in params.modes]


SUITE = StabilitySuite()
