"""`gdn-op`: the single-device GDN core, any registered backends side by side.

One case per (shape, backend): shape = T (or a packed batch of sequences), stateless/stateful,
Hqk, Hv, B; `backend` is any name `gdn.backends.get_backend` resolves (built-ins, entry points of
`gdnval.backends`, `module:function`). The backend is a parameter of the case, so a metric means
the same thing for every backend and the pages pair a case with its `eager` sibling. A backend's
capability check refusing the case is the case's error (its reason), never a silent skip.

Per case:
- `fwd_ms`, `fwd_bwd_ms`: every repetition, device time back to back (`time_repeats`, the
  method of `triton.testing.do_bench`: warm-up first, which absorbs Triton compile and
  autotune; no wait for the device between repetitions; gradients dropped outside the timed
  region). fwd runs with grad-enabled inputs, as in training.
- `fwd_rel`, `fwd_bwd_rel` (cpu only): each repetition's time over a fixed reference workload
  timed around it (`time_against_reference`): what the CPU gate judges, since a shared CPU's
  speed drift cancels in it while the wall clock moves by tens of percent.
- `peak_bytes`: incremental peak allocated of one fwd+bwd (peak minus what the inputs hold).
- `<tensor>_rel_l2|max_abs|max_rel|finite` for o, final state, dq, dk, dv, dg, dbeta, dh0,
  one sample per seed (idx = seed index), against the reference: the fp64 per-token oracle when
  T <= `oracle_max_seq_len`, else our chunked eager backend in fp32 on the device (it equals the
  oracle to ~1e-15 in fp64, so in fp32 it is an fp32-exact oracle). Bound 5e-3 for every backend
  (the eager backend is checked only against the oracle: it is the reference above that).
- `ratio_to_baseline` (this / `baseline` median fwd+bwd, lower is better) and
  `peak_ratio_to_baseline`: the baseline is timed in the same case, on the same inputs, in the
  same process, so the ratio is measured, not assembled across cases. `tflops`: model FLOPs of
  the chunked algorithm / median fwd+bwd.

Packed cases (`packed`: lists of sequence lengths) run B = 1 with `cu_seqlens`, one initial and
final state per sequence. dO and dHT are random and divided by their tensor's element count, so
gradient scale does not grow with T. Inputs: l2-normalised k, β = sigmoid(randn),
g = logsigmoid(randn + 2).
"""

from __future__ import annotations

from typing import Any, ClassVar

from workers.suite import (
    CPU_GATE_PRESETS,
    Case,
    DType,
    Metric,
    NonNegative,
    Positive,
    Suite,
    SuiteParams,
    check_backend_names,
)
from workers.suites.shared.spec import HEAD_DIM, PACKED_16K, PACKED_64K, REPORT_SEQ_LENS, V_HEADS
from workers.verdict import REFERENCE_RELATIVE_MIN_EFFECT

BACKENDS = ("eager", "triton", "fla")  # the GPU presets' default; any registered names are accepted
TENSORS = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
ACC_BOUND = 5e-3


class GDNOpParams(SuiteParams):
    seq_lens: tuple[Positive, ...] = REPORT_SEQ_LENS
    packed: tuple[tuple[Positive, ...], ...] = ()  # packed batches (sequence lengths), B = 1, cu_seqlens
    modes: tuple[str, ...] = ("stateless", "stateful")
    qk_heads: tuple[Positive, ...] = (32, 16)
    v_heads: Positive = V_HEADS
    batch: Positive = 1
    head_dim: Positive = HEAD_DIM
    dtype: DType = "bfloat16"  # bfloat16 | float16 | float32 (the CPU interpreter needs fp16/fp32)
    backends: tuple[str, ...] = BACKENDS
    baseline: str = "fla"  # the ratios' denominator; timed beside every other timed backend
    warmup: NonNegative = 5
    repeat: Positive = 20
    eager_warmup: NonNegative = 5  # the eager backend at 64K takes ~1 s per fwd+bwd
    eager_repeat: Positive = 20
    eager_max_seq_len: int = 65536  # eager is not timed above this
    accuracy_max_seq_len: int = 32768  # 64K is for speed and memory only, as in the report
    accuracy_seeds: tuple[int, ...] = (0, 1, 2)
    oracle_max_seq_len: int = 512  # fp64 per-token oracle up to here, fp32 eager above
    timing: bool = True
    timed_backends: tuple[str, ...] | None = None  # None: every backend; else only these are timed


def _metrics() -> tuple[Metric, ...]:
    out: list[Metric] = [
        Metric("fwd_ms", "ms", "time", description="forward, every repetition"),
        Metric("fwd_bwd_ms", "ms", "time", description="forward + backward, every repetition"),
        Metric("fwd_rel", "x ref", "time", min_effect=REFERENCE_RELATIVE_MIN_EFFECT,
               description="forward over the reference workload timed around it (cpu only)"),
        Metric("fwd_bwd_rel", "x ref", "time", min_effect=REFERENCE_RELATIVE_MIN_EFFECT,
               description="forward + backward over the reference workload (cpu only)"),
        Metric("peak_bytes", "bytes", "memory", description="incremental peak allocated of one fwd+bwd"),
    ]
    for t in TENSORS:
        out += [
            Metric(f"{t}_rel_l2", "ratio", "accuracy", bound=ACC_BOUND,
                   description=f"{t}: ||a-ref|| / ||ref||, one sample per seed"),
            Metric(f"{t}_max_abs", "abs", "accuracy", diagnostic=True,
                   description=f"{t}: max |a-ref| (diagnostic)"),
            Metric(f"{t}_max_rel", "ratio", "accuracy", diagnostic=True,
                   description=f"{t}: max |a-ref|/|ref| (diagnostic: set by near-zero reference values)"),
            Metric(f"{t}_finite", "bool", "check", "higher", bound=1.0, description=f"{t}: all finite"),
        ]
    out += [
        Metric("ratio_to_baseline", "x", "time", "lower", repeated=False,
               description="median fwd+bwd / the baseline's, timed in the same case (triton/fla goal "
                           "<= 0.8 at 16K+ stateful 32/32)"),
        Metric("peak_ratio_to_baseline", "x", "memory", "lower",
               description="incremental peak allocated / the baseline's"),
        Metric("tflops", "TFLOP/s", "time", "higher", repeated=False,
               description="model FLOPs of the chunked algorithm / median fwd+bwd (not for eager)"),
    ]
    return tuple(out)


class GDNOpSuite(Suite):
    name = "gdn-op"
    gate_presets = CPU_GATE_PRESETS
    description = "single-device GDN core: any registered backends side by side (time, memory, accuracy)"
    params_model = GDNOpParams
    run_module = "workers.suites.gdn_op.run"
    devices: ClassVar[tuple[str, ...]] = ("cuda", "npu", "cpu")  # npu: eager (device_presets)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # CPU-sized: the Triton kernels under the interpreter, fp32, a few chunks, fp64 oracle;
        # only the eager core is timed (the interpreter's times say nothing about the kernels).
        "quick": {
            "seq_lens": (65,), "modes": ("stateless", "stateful"), "qk_heads": (1,), "v_heads": 2,
            "dtype": "float32", "backends": ("eager", "triton"), "baseline": "eager",
            "timed_backends": ("eager",), "eager_warmup": 1, "eager_repeat": 5, "accuracy_seeds": (0,),
        },
        # The gate on a CPU machine (2 shared cores): Triton's accuracy under the interpreter, and
        # the eager core timed 15 times at a length where a call takes ~15 ms (at 2 ms a call,
        # process-to-process shifts of 20-40% swamp any change; docs/benchmarks.md, the CPU gate).
        "gate-cpu": {
            "seq_lens": (512,), "modes": ("stateful",), "qk_heads": (2,), "v_heads": 4,
            "dtype": "float32", "backends": ("eager", "triton"), "baseline": "eager",
            "timed_backends": ("eager",), "eager_warmup": 3, "eager_repeat": 15, "accuracy_seeds": (0,),
        },
        # Per-commit GPU check: one stateful length per head layout, one seed.
        "gate": {
            "seq_lens": (16384,), "modes": ("stateful",), "qk_heads": (32, 16),
            "accuracy_seeds": (0,), "eager_warmup": 1, "eager_repeat": 5,
        },
        "full": {"packed": (PACKED_16K, PACKED_64K)},
    }
    metrics = _metrics()
    # 2: one case per backend, metric names without the backend (version 1 had `<backend>_<metric>`
    # in one case per shape): a gate across the change is refused, not passed with nothing paired
    version = 2

    def time_repeats(self, params: SuiteParams) -> int:
        assert isinstance(params, GDNOpParams)
        if not params.timing:
            return 0
        timed = params.backends if params.timed_backends is None else params.timed_backends
        reps = [params.eager_repeat if b == "eager" else params.repeat for b in timed]
        return min(reps, default=0)

    def backends(self, params: SuiteParams) -> tuple[str, ...]:
        assert isinstance(params, GDNOpParams)
        return tuple(dict.fromkeys((*params.backends, params.baseline)))

    def cases(self, params: SuiteParams) -> list[Case]:
        """(shape, backend) pairs; the names are checked for form here (no torch on the service)
        and resolved on the ranks, where an unknown one fails naming the registered ones."""
        assert isinstance(params, GDNOpParams)
        check_backend_names([*params.backends, params.baseline])
        if len(set(params.backends)) != len(params.backends):
            raise ValueError(f"backends {list(params.backends)} name a backend twice")
        if params.baseline not in params.backends:
            raise ValueError(f"baseline {params.baseline!r} is not one of the backends "
                             f"{list(params.backends)}; add it or name another")
        bad_modes = sorted(set(params.modes) - {"stateless", "stateful"})
        if bad_modes:
            raise ValueError(f"unknown mode(s) {bad_modes}; expected stateless and/or stateful")
        base = params.model_dump()
        drop = ("seq_lens", "packed", "modes", "qk_heads", "backends")
        shapes: list[tuple[str, dict[str, Any]]] = [(f"T{T}", {"seq_len": T}) for T in params.seq_lens]
        for lens in params.packed:
            shapes.append((f"packed{len(lens)}_T{sum(lens)}", {"seq_len": sum(lens), "packed": list(lens)}))
        out = []
        for tag, shape in shapes:
            batch = 1 if "packed" in shape else params.batch
            for mode in params.modes:
                for hqk in params.qk_heads:
                    for backend in params.backends:
                        p = {k: v for k, v in base.items() if k not in drop}
                        p.update(shape, batch=batch, mode=mode, qk_heads=hqk, backend=backend)
                        name = f"{tag}_{mode}_hqk{hqk}_hv{params.v_heads}_b{batch}_{backend}"
                        out.append(Case(self.name, name, p))
        return out


SUITE = GDNOpSuite()
