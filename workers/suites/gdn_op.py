"""`gdn-op`: the single-device GDN core, our Triton kernels against our eager backend and FLA (§4).

One case per shape (T, stateless/stateful, Hqk, Hv, B): every backend of the case runs on the
same inputs in the same process, so the ratios (speed-up over eager, ratio to FLA, memory ratio)
are measured, not assembled across jobs.

Per backend `<b>` in (eager, triton, fla):
- `<b>_fwd_ms`, `<b>_fwd_bwd_ms`: every repetition (`time_repeats`: warm-up first, which absorbs
  Triton compile and autotune). fwd runs with grad-enabled inputs, as in training.
- `<b>_fwd_rel`, `<b>_fwd_bwd_rel` (cpu only): each repetition's time over a fixed reference
  workload timed around it (`time_against_reference`): what the CPU gate judges, since a shared
  CPU's speed drift cancels in it while the wall clock moves by tens of percent.
- `<b>_peak_bytes`: incremental peak allocated of one fwd+bwd (peak minus what the inputs hold).
- `<b>_<tensor>_rel_l2|max_abs|max_rel|finite` for o, final state, dq, dk, dv, dg, dbeta, dh0,
  one sample per seed (idx = seed index), against the reference: the fp64 per-token oracle when
  T <= `oracle_max_seq_len`, else our chunked eager backend in fp32 on the device (it equals the
  oracle to ~1e-15 in fp64, so in fp32 it is an fp32-exact oracle). Bound 5e-3 for triton; eager
  and fla are recorded without a bound.
Derived in-run (medians of fwd+bwd): `speedup_vs_eager` (triton), `ratio_to_fla` (triton / fla,
lower is better, bound 1.0: "no slower"; the issue's 0.8 at 16K+ stateful is read off the table),
`peak_ratio_to_fla` (bound 1.0), `tflops` (model FLOPs of the chunked algorithm / median time).

dO and dHT are random and divided by their tensor's element count, so gradient scale does not
grow with T. Inputs: l2-normalised k, β = sigmoid(randn), g = logsigmoid(randn + 2).
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, ClassVar

from workers.context import RankContext
from workers.suite import (
    CPU_GATE_PRESETS,
    Case,
    DType,
    Metric,
    NonNegative,
    Positive,
    Sample,
    Suite,
    SuiteParams,
)
from workers.verdict import REFERENCE_RELATIVE_MIN_EFFECT

BACKENDS = ("eager", "triton", "fla")
TENSORS = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
ACC_BOUND = 5e-3
CHUNK = 64


class GDNOpParams(SuiteParams):
    seq_lens: tuple[Positive, ...] = (8192, 16384, 32768, 65536)
    modes: tuple[str, ...] = ("stateless", "stateful")
    qk_heads: tuple[Positive, ...] = (32, 16)
    v_heads: Positive = 32
    batch: Positive = 1
    head_dim: Positive = 128
    dtype: DType = "bfloat16"  # bfloat16 | float16 | float32 (the CPU interpreter needs fp16/fp32)
    backends: tuple[str, ...] = BACKENDS
    warmup: NonNegative = 5
    repeat: Positive = 20
    eager_warmup: NonNegative = 5  # the eager backend at 64K takes ~1 s per fwd+bwd
    eager_repeat: Positive = 20
    eager_max_seq_len: int = 65536  # eager is not timed above this
    accuracy_max_seq_len: int = 32768  # 64K is for speed and memory only (§4)
    accuracy_seeds: tuple[int, ...] = (0, 1, 2)
    oracle_max_seq_len: int = 512  # fp64 per-token oracle up to here, fp32 eager above
    timing: bool = True
    timed_backends: tuple[str, ...] | None = None  # None: every backend; else only these are timed


def _metrics() -> tuple[Metric, ...]:
    out: list[Metric] = []
    for b in BACKENDS:
        out += [
            Metric(f"{b}_fwd_ms", "ms", "time", description=f"{b} forward, every repetition"),
            Metric(f"{b}_fwd_bwd_ms", "ms", "time", description=f"{b} forward + backward, every repetition"),
            Metric(f"{b}_fwd_rel", "x ref", "time", min_effect=REFERENCE_RELATIVE_MIN_EFFECT,
                   description=f"{b} forward over the reference workload timed around it (cpu only)"),
            Metric(f"{b}_fwd_bwd_rel", "x ref", "time", min_effect=REFERENCE_RELATIVE_MIN_EFFECT,
                   description=f"{b} forward + backward over the reference workload (cpu only)"),
            Metric(f"{b}_peak_bytes", "bytes", "memory",
                   description=f"{b} incremental peak allocated of one fwd+bwd"),
        ]  # fmt: skip
        bound = ACC_BOUND if b == "triton" else None
        for t in TENSORS:
            out += [
                Metric(f"{b}_{t}_rel_l2", "ratio", "accuracy", bound=bound,
                       description=f"{b} {t}: ||a-ref|| / ||ref||, one sample per seed"),
                Metric(f"{b}_{t}_max_abs", "abs", "accuracy", description=f"{b} {t}: max |a-ref|"),
                Metric(f"{b}_{t}_max_rel", "ratio", "accuracy", description=f"{b} {t}: max |a-ref|/|ref|"),
                Metric(f"{b}_{t}_finite", "bool", "check", "higher", bound=1.0 if b == "triton" else None,
                       description=f"{b} {t}: all finite"),
            ]  # fmt: skip
    out += [
        Metric("speedup_vs_eager", "x", "time", "higher", repeated=False,
               description="eager / triton median fwd+bwd (report: 12.65/22.37/40.08/74.17 at 8K-64K)"),
        Metric("ratio_to_fla", "x", "time", "lower", bound=1.0, repeated=False,
               description="triton / fla median fwd+bwd (goal <= 0.8 at 16K+ stateful 32/32)"),
        Metric("peak_ratio_to_fla", "x", "memory", "lower", bound=1.0,
               description="triton / fla incremental peak allocated"),
        Metric("triton_tflops", "TFLOP/s", "time", "higher", repeated=False,
               description="model FLOPs of the chunked algorithm / triton median fwd+bwd"),
        Metric("fla_tflops", "TFLOP/s", "time", "higher", repeated=False,
               description="same FLOPs / fla median fwd+bwd"),
    ]  # fmt: skip
    return tuple(out)


def fwd_bwd_flops(batch: int, seq_len: int, v_heads: int, head_dim: int = 128) -> float:
    """Matrix FLOPs of one chunked fwd+bwd (chunk 64, no recompute counted).

    Per chunk and head, multiply-adds: forward 5·C²·D + 3·C·D² (K·Kᵀ, Wk, U, Q·Kᵀ, P·Vn; Wk·S,
    Kᵀ·Vn, Q·S); backward 13·C²·D + 6·C·D² + 2·C³ (see docs/kernels.md). FLOPs = 2·MACs."""
    C, Dh = CHUNK, head_dim
    chunks = -(-seq_len // C)
    macs = (5 + 13) * C * C * Dh + (3 + 6) * C * Dh * Dh + 2 * C**3
    return 2.0 * macs * chunks * batch * v_heads


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None


class GDNOpSuite(Suite):
    name = "gdn-op"
    gate_presets = CPU_GATE_PRESETS
    description = "single-device GDN core: Triton vs eager vs flash-linear-attention (time, memory, accuracy)"
    params_model = GDNOpParams
    devices: ClassVar[tuple[str, ...]] = ("cuda", "npu", "cpu")  # npu: eager (device_presets)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # CPU-sized: the Triton kernels under the interpreter, fp32, a few chunks, fp64 oracle;
        # only the eager core is timed (the interpreter's times say nothing about the kernels).
        "quick": {
            "seq_lens": (65,), "modes": ("stateless", "stateful"), "qk_heads": (1,), "v_heads": 2,
            "dtype": "float32", "backends": ("eager", "triton"), "timed_backends": ("eager",),
            "eager_warmup": 1, "eager_repeat": 5, "accuracy_seeds": (0,),
        },
        # The gate on a CPU machine (2 shared cores): Triton's accuracy under the interpreter, and
        # the eager core timed 15 times at a length where a call takes ~15 ms (at 2 ms a call,
        # process-to-process shifts of 20-40% swamp any change; docs/benchmarks.md, the CPU gate).
        "gate-cpu": {
            "seq_lens": (512,), "modes": ("stateful",), "qk_heads": (2,), "v_heads": 4,
            "dtype": "float32", "backends": ("eager", "triton"), "timed_backends": ("eager",),
            "eager_warmup": 3, "eager_repeat": 15, "accuracy_seeds": (0,),
        },
        # Per-commit GPU check: one stateful length per head layout, one seed.
        "gate": {
            "seq_lens": (16384,), "modes": ("stateful",), "qk_heads": (32, 16),
            "accuracy_seeds": (0,), "eager_warmup": 1, "eager_repeat": 5,
        },
        "full": {},
    }  # fmt: skip
    metrics = _metrics()

    def time_repeats(self, params: SuiteParams) -> int:
        assert isinstance(params, GDNOpParams)
        if not params.timing:
            return 0
        timed = params.backends if params.timed_backends is None else params.timed_backends
        reps = [params.eager_repeat if b == "eager" else params.repeat for b in timed]
        return min(reps, default=0)

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, GDNOpParams)
        unknown = sorted(set(params.backends) - set(BACKENDS))
        if unknown:
            raise ValueError(f"unknown backend(s) {unknown}; expected a subset of {BACKENDS}")
        bad_modes = sorted(set(params.modes) - {"stateless", "stateful"})
        if bad_modes:
            raise ValueError(f"unknown mode(s) {bad_modes}; expected stateless and/or stateful")
        base = params.model_dump()
        out = []
        for T in params.seq_lens:
            for mode in params.modes:
                for hqk in params.qk_heads:
                    p = {k: v for k, v in base.items() if k not in ("seq_lens", "modes", "qk_heads")}
                    p.update(seq_len=T, mode=mode, qk_heads=hqk)
                    name = f"T{T}_{mode}_hqk{hqk}_hv{params.v_heads}_b{params.batch}"
                    out.append(Case(self.name, name, p))
        return out

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        yield from _run_case(ctx, case)


# ------------------------------------------------------------------------------------------------
# Rank side: everything below imports torch inside the functions.
# ------------------------------------------------------------------------------------------------
def _make_inputs(ctx: RankContext, p: dict[str, Any], seed: int) -> dict[str, Any]:
    """Inputs in the case dtype on the device, plus dO and dHT divided by their element count."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cpu").manual_seed(seed)
    B, T, Hq, Hv, Dh = p["batch"], p["seq_len"], p["qk_heads"], p["v_heads"], p["head_dim"]
    dt = getattr(torch, p["dtype"])

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    x = {
        "q": rnd(B, T, Hq, Dh).to(dt),
        "k": F.normalize(rnd(B, T, Hq, Dh), dim=-1).to(dt),
        "v": rnd(B, T, Hv, Dh).to(dt),
        "g": F.logsigmoid(rnd(B, T, Hv) + 2.0),
        "beta": torch.sigmoid(rnd(B, T, Hv)).to(dt),
        "h0": rnd(B, Hv, Dh, Dh) * 0.1 if p["mode"] == "stateful" else None,
    }
    do = rnd(B, T, Hv, Dh)
    x["do"] = (do / do.numel()).to(dt)
    dht = rnd(B, Hv, Dh, Dh)
    x["dht"] = dht / dht.numel() if p["mode"] == "stateful" else None
    return {k: (v.to(ctx.device) if v is not None else None) for k, v in x.items()}


def _call(backend: str, x: dict[str, Any], final: bool) -> tuple[Any, Any]:
    """One forward of `backend` on leaves x; returns (o, final_state | None)."""
    if backend == "fla":
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        # FLA 0.6.0 refuses its gated backward on Hopper with Triton < 3.7.1 (its issue 640);
        # we set its own flag to time it and record its accuracy beside ours.
        fla_chunk_o.TRITON_ABOVE_3_7_1 = True
        return chunk_gated_delta_rule(
            x["q"], x["k"], x["v"], x["g"], x["beta"],
            initial_state=x["h0"], output_final_state=final,
        )  # fmt: skip
    from gdn import gated_delta_rule

    return gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"],
        initial_state=x["h0"], output_final_state=final, backend=backend,
    )  # fmt: skip


_LEAVES = ("q", "k", "v", "g", "beta", "h0")


def _leaves(x: dict[str, Any], dtype: Any = None) -> dict[str, Any]:
    out = dict(x)
    for n in _LEAVES:
        if x[n] is not None:
            t = x[n].detach().clone()
            if dtype is not None:
                t = t.to(dtype)
            out[n] = t.requires_grad_(True)
    return out


def _fwd_bwd(backend: str, x: dict[str, Any], final: bool) -> dict[str, Any]:
    """Forward + backward with x's dO/dHT; returns o, ht and the leaves' gradients."""
    import torch

    o, ht = _call(backend, x, final)
    outs, grads = [o], [x["do"].to(o.dtype)]
    if final and x["dht"] is not None:
        outs.append(ht)
        grads.append(x["dht"].to(ht.dtype))
    torch.autograd.backward(outs, grads)
    res = {"o": o.detach(), "ht": ht.detach() if ht is not None else None}
    for n in _LEAVES:
        res[f"d{n}" if n != "beta" else "dbeta"] = x[n].grad if x[n] is not None else None
    return res


def _reference(x: dict[str, Any], p: dict[str, Any], final: bool) -> dict[str, Any]:
    """fp64 per-token oracle (short T) or fp32 chunked eager (long T) on the upcast inputs."""
    import torch

    from gdn import recurrent_gated_delta_rule

    if p["seq_len"] <= p["oracle_max_seq_len"]:
        r = _leaves(x, torch.float64)
        r["do"], r["dht"] = x["do"].double(), None if x["dht"] is None else x["dht"].double()
        o, ht = recurrent_gated_delta_rule(
            r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["h0"], output_final_state=final
        )
        outs, grads = [o], [r["do"]]
        if final and r["dht"] is not None:
            outs.append(ht)
            grads.append(r["dht"])
        torch.autograd.backward(outs, grads)
        res = {"o": o.detach(), "ht": ht.detach() if ht is not None else None}
        for n in _LEAVES:
            res[f"d{n}" if n != "beta" else "dbeta"] = r[n].grad if r[n] is not None else None
        return res
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 reference
    try:
        r = _leaves(x, torch.float32)
        r["do"] = x["do"].float()
        return _fwd_bwd("eager", r, final)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def _accuracy(ctx: RankContext, case: Case, p: dict[str, Any], backends: list[str]) -> Iterator[Sample]:
    from workers.measure import error_samples, tensor_error

    final = p["mode"] == "stateful"
    for idx, seed in enumerate(p["accuracy_seeds"]):
        x = _make_inputs(ctx, p, seed)
        ref = _reference(x, p, final)
        for b in backends:
            got = _fwd_bwd(b, _leaves(x), final)
            for t in TENSORS:
                if ref.get(t) is None or got.get(t) is None:
                    continue
                err = tensor_error(got[t], ref[t])
                for s in error_samples(ctx, case.name, f"{b}_{t}", err):
                    yield replace(s, idx=idx)
            del got
        del ref, x


def _timing(ctx: RankContext, case: Case, p: dict[str, Any], backends: list[str]) -> Iterator[Sample]:
    from gdn import device as devices
    from workers.measure import measure_peak_memory, time_against_reference, time_repeats, time_samples

    final = p["mode"] == "stateful"
    x = _leaves(_make_inputs(ctx, p, 1000))
    med: dict[str, float] = {}
    peak: dict[str, float] = {}
    timed = p.get("timed_backends")
    for b in backends:
        if b == "eager" and p["seq_len"] > p["eager_max_seq_len"]:
            continue
        if timed is not None and b not in timed:
            continue
        warm, rep = (p["eager_warmup"], p["eager_repeat"]) if b == "eager" else (p["warmup"], p["repeat"])

        def fwd(b: str = b) -> None:
            _call(b, x, final)

        def fwd_bwd(b: str = b) -> None:
            for n in _LEAVES:
                if x[n] is not None:
                    x[n].grad = None
            _fwd_bwd(b, x, final)

        for fn, name in ((fwd, "fwd"), (fwd_bwd, "fwd_bwd")):
            if ctx.device_kind == "cpu":  # a shared CPU's drift cancels in the relative time
                times, relative = time_against_reference(ctx, fn, warmup=warm, repeat=rep)
                yield from time_samples(ctx, case.name, f"{b}_{name}_rel", relative)
            else:
                times = time_repeats(ctx, fn, warmup=warm, repeat=rep)
            yield from time_samples(ctx, case.name, f"{b}_{name}_ms", times)
        med[b] = median(times)
        for n in _LEAVES:
            if x[n] is not None:
                x[n].grad = None
        mem = measure_peak_memory(ctx, fwd_bwd, incremental=True)
        if mem.tracked:
            peak[b] = float(mem.peak_allocated)
            yield Sample(case.name, f"{b}_peak_bytes", peak[b], rank=ctx.rank)
        for n in _LEAVES:
            if x[n] is not None:
                x[n].grad = None
        devices.empty_cache(ctx.device)
    flops = fwd_bwd_flops(p["batch"], p["seq_len"], p["v_heads"], p["head_dim"])
    if "triton" in med and "eager" in med:
        yield Sample(case.name, "speedup_vs_eager", med["eager"] / med["triton"], rank=ctx.rank)
    if "triton" in med and "fla" in med:
        yield Sample(case.name, "ratio_to_fla", med["triton"] / med["fla"], rank=ctx.rank)
    if "triton" in peak and "fla" in peak:
        yield Sample(case.name, "peak_ratio_to_fla", peak["triton"] / peak["fla"], rank=ctx.rank)
    for b in ("triton", "fla"):
        if b in med:
            yield Sample(case.name, f"{b}_tflops", flops / (med[b] * 1e-3) / 1e12, rank=ctx.rank)


def _run_case(ctx: RankContext, case: Case) -> Iterator[Sample]:
    p = dict(case.params)
    backends = [b for b in p["backends"] if b != "fla" or fla_available()]
    if "fla" in p["backends"] and "fla" not in backends:
        print(f"{case.name}: flash-linear-attention is not importable; fla left out")
    if ctx.device_kind == "cpu":
        backends = [b for b in backends if b != "fla"]  # FLA needs a GPU
    if p["seq_len"] <= p["accuracy_max_seq_len"]:
        # The eager backend is the reference above oracle_max_seq_len: comparing it with itself
        # would prove nothing, so it is checked only against the fp64 oracle.
        acc = [b for b in backends if b != "eager" or p["seq_len"] <= p["oracle_max_seq_len"]]
        yield from _accuracy(ctx, case, p, acc)
    if p["timing"]:
        yield from _timing(ctx, case, p, backends)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


SUITE = GDNOpSuite()
