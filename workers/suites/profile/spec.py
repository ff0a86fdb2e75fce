"""`profile`: one `torch.profiler` trace per CP mode of one forward+backward of the network.

The trace (gzipped Chrome JSON, without shapes or stacks to keep it small) is written into the rank's
`ctx.artifacts_dir`, which the executor ships with the job as a downloadable artifact. It is not a
timing: warm-up passes run first. Read back on the rank (`workers.suites.profile.trace`), it gives
the time each collective family took and how often it ran, the time spent communicating and
computing, and how much of the communication ran under compute: recorded per rank, never judged.
"""

from __future__ import annotations

from typing import Any, ClassVar

from workers.suite import CPU_GATE_PRESETS, Case, Metric, Suite, SuiteParams, cp_misfit
from workers.suites.profile.trace import FAMILIES, OTHER
from workers.suites.shared.spec import CP_MODES, ModelParams, case_base, check_modes_and_dtype


class ProfileParams(ModelParams):
    checkpoint: str = "off"
    warmup: int = 1


class ProfileSuite(Suite):
    name = "profile"
    gate_presets = CPU_GATE_PRESETS
    description = "one torch.profiler trace per CP mode (forward+backward), kept as a job artifact"
    params_model = ProfileParams
    run_module = "workers.suites.profile.run"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        # one CPU-sized trace per mode: the no-CP network on one rank, the CP modes from 2 ranks
        "gate-cpu": {"modes": ("none", "ulysses", "p2p", "all_gather")},
        "gate": {"model": "qwen35-4l", "seq_len": 16384, "dtype": "bfloat16", "backend": "triton",
                 "corpus": "package", "modes": ("ulysses", "p2p"), "warmup": 2},
        "full": {"model": "qwen35-4l", "seq_len": 65536, "dtype": "bfloat16", "backend": "triton",
                 "corpus": "package", "modes": ("ulysses", "p2p"), "warmup": 2},
    }
    metrics = (
        Metric("trace_written", "bool", "check", "higher", bound=1.0,
               description="1 when this rank wrote its trace into the artifacts directory"),
        Metric("trace_events", "count", "check", "higher", description="events in this rank's trace"),
        Metric("trace_bytes", "bytes", "memory", description="size of this rank's trace file"),
        Metric("comm_ms", "ms", "time", repeated=False,
               description="time communicating in the trace (the union of its collectives)"),
        Metric("compute_ms", "ms", "time", repeated=False,
               description="time computing in the trace (the union of its compute kernels or operators)"),
        Metric("comm_overlap_ms", "ms", "time", repeated=False,
               description="time communicating and computing at once"),
        Metric("comm_overlap_share", "ratio", "check", "higher",
               description="the share of the communication time that ran under compute"),
        *(m for f in (*(name for name, _ in FAMILIES), OTHER) for m in (
            Metric(f"coll_{f}_ms", "ms", "time", repeated=False,
                   description=f"{f.replace('_', ' ')} collectives: their summed duration in the trace"),
            Metric(f"coll_{f}_calls", "count", "check", "higher",
                   description=f"{f.replace('_', ' ')} collectives in the trace"))),
    )

    def misfit(self, case: Case, world_size: int) -> str | None:
        return cp_misfit(case.params, world_size)

    def backends(self, params: SuiteParams) -> tuple[str, ...]:
        assert isinstance(params, ProfileParams)
        return (params.backend,)

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, ProfileParams)
        check_modes_and_dtype(params.modes, CP_MODES, params.dtype)
        base = case_base(params, {"modes"})
        return [Case(self.name, f"trace/{m}", {**base, "mode": m}) for m in params.modes]


SUITE = ProfileSuite()
