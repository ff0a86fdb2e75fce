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
    check_backend_names,
)
from workers.verdict import REFERENCE_RELATIVE_MIN_EFFECT

BACKENDS = ("eager", "triton", "fla")  # the GPU presets' default; any registered names are accepted
TENSORS = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
ACC_BOUND = 5e-3
CHUNK = 64
# 8 sequences of mixed lengths (1, 63, 64, 65: boundaries inside, on and across a chunk) summing to 16K / 64K
PACKED_16K = (1, 63, 64, 65, 1000, 3000, 4096, 8095)
PACKED_64K = (4096, 12288, 1, 65, 8192, 16384, 20000, 4510)


class GDNOpParams(SuiteParams):
    seq_lens: tuple[Positive, ...] = (8192, 16384, 32768, 65536)
    packed: tuple[tuple[Positive, ...], ...] = ()  # packed batches (sequence lengths), B = 1, cu_seqlens
    modes: tuple[str, ...] = ("stateless", "stateful")
    qk_heads: tuple[Positive, ...] = (32, 16)
    v_heads: Positive = 32
    batch: Positive = 1
    head_dim: Positive = 128
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
    ]  # fmt: skip
    for t in TENSORS:
        out += [
            Metric(f"{t}_rel_l2", "ratio", "accuracy", bound=ACC_BOUND,
                   description=f"{t}: ||a-ref|| / ||ref||, one sample per seed"),
            Metric(f"{t}_max_abs", "abs", "accuracy", description=f"{t}: max |a-ref|"),
            Metric(f"{t}_max_rel", "ratio", "accuracy", description=f"{t}: max |a-ref|/|ref|"),
            Metric(f"{t}_finite", "bool", "check", "higher", bound=1.0, description=f"{t}: all finite"),
        ]  # fmt: skip
    out += [
        Metric("ratio_to_baseline", "x", "time", "lower", repeated=False,
               description="median fwd+bwd / the baseline's, timed in the same case (triton/fla goal "
                           "<= 0.8 at 16K+ stateful 32/32)"),
        Metric("peak_ratio_to_baseline", "x", "memory", "lower",
               description="incremental peak allocated / the baseline's"),
        Metric("tflops", "TFLOP/s", "time", "higher", repeated=False,
               description="model FLOPs of the chunked algorithm / median fwd+bwd (not for eager)"),
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


class GDNOpSuite(Suite):
    name = "gdn-op"
    gate_presets = CPU_GATE_PRESETS
    description = "single-device GDN core: any registered backends side by side (time, memory, accuracy)"
    params_model = GDNOpParams
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
    }  # fmt: skip
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
                             f"{list(params.backends)}; add it or name another")  # fmt: skip
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

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        yield from _run_case(ctx, case)


# ------------------------------------------------------------------------------------------------
# Rank side: everything below imports torch inside the functions.
# ------------------------------------------------------------------------------------------------
def _make_inputs(ctx: RankContext, p: dict[str, Any], seed: int) -> dict[str, Any]:
    """Inputs in the case dtype on the device, plus dO and dHT divided by their element count.
    A packed case (`packed`: sequence lengths) adds `cu` (int32 offsets) and one state per sequence."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cpu").manual_seed(seed)
    B, T, Hq, Hv, Dh = p["batch"], p["seq_len"], p["qk_heads"], p["v_heads"], p["head_dim"]
    packed = p.get("packed")
    states = len(packed) if packed else B
    dt = getattr(torch, p["dtype"])

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    x = {
        "q": rnd(B, T, Hq, Dh).to(dt),
        "k": F.normalize(rnd(B, T, Hq, Dh), dim=-1).to(dt),
        "v": rnd(B, T, Hv, Dh).to(dt),
        "g": F.logsigmoid(rnd(B, T, Hv) + 2.0),
        "beta": torch.sigmoid(rnd(B, T, Hv)).to(dt),
        "h0": rnd(states, Hv, Dh, Dh) * 0.1 if p["mode"] == "stateful" else None,
        "cu": torch.tensor([0, *torch.tensor(packed).cumsum(0).tolist()], dtype=torch.int32)
        if packed else None,
    }
    do = rnd(B, T, Hv, Dh)
    x["do"] = (do / do.numel()).to(dt)
    dht = rnd(states, Hv, Dh, Dh)
    x["dht"] = dht / dht.numel() if p["mode"] == "stateful" else None
    return {k: (v.to(ctx.device) if v is not None else None) for k, v in x.items()}


def _call(backend: str, x: dict[str, Any], final: bool) -> tuple[Any, Any]:
    """One forward of `backend` (any registered name) on leaves x; returns (o, final_state | None)."""
    from gdn import gated_delta_rule

    return gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"],
        initial_state=x["h0"], output_final_state=final, cu_seqlens=x.get("cu"), backend=backend,
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
            r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["h0"], output_final_state=final,
            cu_seqlens=x.get("cu"),
        )  # fmt: skip
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


def _accuracy(ctx: RankContext, case: Case, p: dict[str, Any], backend: str) -> Iterator[Sample]:
    from workers.measure import error_samples, tensor_error

    final = p["mode"] == "stateful"
    for idx, seed in enumerate(p["accuracy_seeds"]):
        x = _make_inputs(ctx, p, seed)
        ref = _reference(x, p, final)
        got = _fwd_bwd(backend, _leaves(x), final)
        for t in TENSORS:
            if ref.get(t) is None or got.get(t) is None:
                continue
            err = tensor_error(got[t], ref[t])
            for s in error_samples(ctx, case.name, t, err):
                yield replace(s, idx=idx)
        del got, ref, x


def _timed(p: dict[str, Any], b: str) -> bool:
    if b == "eager" and p["seq_len"] > p["eager_max_seq_len"]:
        return False
    timed = p.get("timed_backends")
    return timed is None or b in timed


def timed_calls(backend: str, x: dict[str, Any], final: bool) -> tuple[Any, Any, Any]:
    """(fwd, fwd_bwd, reset) of `backend` on leaves x, the calls the timing repeats.

    Everything that is the same for every call is done here, once: the function is looked up,
    dO and dHT are cast to the outputs' dtypes (o has v's dtype, the final state is fp32) and the
    gradient list is built. `reset` drops the leaves' gradients; it runs outside the timed region
    (`time_repeats`' `before`), so a repetition is the backend's forward and backward alone.
    Every call still goes through `gdn.gated_delta_rule` and its checks, as a user's does.
    """
    import torch

    from gdn import gated_delta_rule

    q, k, v, g, beta, h0, cu = (x[n] for n in ("q", "k", "v", "g", "beta", "h0", "cu"))
    leaves = [x[n] for n in _LEAVES if x[n] is not None]
    grads = [x["do"].to(v.dtype)]
    if final and x["dht"] is not None:
        grads.append(x["dht"].to(torch.float32))
    backward = torch.autograd.backward

    def fwd() -> None:
        gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=final, cu_seqlens=cu,
                         backend=backend)  # fmt: skip

    def fwd_bwd() -> None:
        o, ht = gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=final,
                                 cu_seqlens=cu, backend=backend)  # fmt: skip
        backward([o, ht] if len(grads) == 2 else [o], grads)

    def reset() -> None:
        for t in leaves:
            t.grad = None

    return fwd, fwd_bwd, reset


def _timing(ctx: RankContext, case: Case, p: dict[str, Any], backends: list[str]) -> Iterator[Sample]:
    """Times `backends` on one set of inputs; the samples are the case's backend's (the last),
    the others (its baseline) only give the ratios' denominators."""
    from gdn import device as devices
    from workers.measure import measure_peak_memory, time_against_reference, time_repeats, time_samples

    final = p["mode"] == "stateful"
    x = _leaves(_make_inputs(ctx, p, 1000))
    mine = p["backend"]
    med: dict[str, float] = {}
    peak: dict[str, float] = {}
    for b in backends:
        warm, rep = (p["eager_warmup"], p["eager_repeat"]) if b == "eager" else (p["warmup"], p["repeat"])
        fwd, fwd_bwd, reset = timed_calls(b, x, final)
        times_of: dict[str, list[float]] = {}
        for fn, name in ((fwd, "fwd"), (fwd_bwd, "fwd_bwd")):
            if ctx.device_kind == "cpu":  # a shared CPU's drift cancels in the relative time
                times_of[name], relative = time_against_reference(
                    ctx, fn, warmup=warm, repeat=rep, before=reset
                )
                if b == mine:
                    yield from time_samples(ctx, case.name, f"{name}_rel", relative)
            else:
                times_of[name] = time_repeats(ctx, fn, warmup=warm, repeat=rep, before=reset)
            if b == mine:
                yield from time_samples(ctx, case.name, f"{name}_ms", times_of[name])
        times = times_of["fwd_bwd"]
        med[b] = median(times)
        reset()
        mem = measure_peak_memory(ctx, fwd_bwd, incremental=True)
        if mem.tracked:
            peak[b] = float(mem.peak_allocated)
            if b == mine:
                yield Sample(case.name, "peak_bytes", peak[b], rank=ctx.rank)
        reset()
        devices.empty_cache(ctx.device)
    base = p["baseline"]
    if mine != base and mine in med and base in med:
        yield Sample(case.name, "ratio_to_baseline", med[mine] / med[base], rank=ctx.rank)
    if mine != base and mine in peak and base in peak:
        yield Sample(case.name, "peak_ratio_to_baseline", peak[mine] / peak[base], rank=ctx.rank)
    if mine in med and mine != "eager":  # the eager core's FLOP rate says nothing
        lens = p.get("packed") or [p["seq_len"]] * p["batch"]
        flops = sum(fwd_bwd_flops(1, n, p["v_heads"], p["head_dim"]) for n in lens)
        yield Sample(case.name, "tflops", flops / (med[mine] * 1e-3) / 1e12, rank=ctx.rank)


def _unsupported(ctx: RankContext, p: dict[str, Any], backend: str) -> str | None:
    """The backend's capability check for this case (an unknown name raises, naming the known ones)."""
    import torch

    from gdn import GDNShape, get_backend

    n = len(p["packed"]) if p.get("packed") else None
    shape = GDNShape(p["batch"], p["seq_len"], p["qk_heads"], p["v_heads"], p["head_dim"], p["head_dim"], n)
    return get_backend(backend).unsupported(shape, getattr(torch, p["dtype"]), ctx.device)


def _run_case(ctx: RankContext, case: Case) -> Iterator[Sample]:
    p = dict(case.params)
    mine, base = p["backend"], p["baseline"]
    timed = [b for b in dict.fromkeys((base, mine)) if _timed(p, b)]
    timed = timed if p["timing"] and _timed(p, mine) else []
    from gdn import UnsupportedGDNRequest

    reason = _unsupported(ctx, p, mine)
    if reason is not None:  # the case's error, with the backend's own reason
        raise UnsupportedGDNRequest(reason)
    if base in timed and base != mine and (why := _unsupported(ctx, p, base)) is not None:
        # its own case errors with this reason; here only the ratios are missing
        print(f"{case.name}: baseline {base!r} cannot run, no ratios: {why}")
        timed.remove(base)
    # The eager backend is the reference above oracle_max_seq_len: comparing it with itself would
    # prove nothing, so it is checked only against the fp64 oracle.
    oracle = p["seq_len"] <= p["oracle_max_seq_len"]
    if p["seq_len"] <= p["accuracy_max_seq_len"] and (mine != "eager" or oracle):
        yield from _accuracy(ctx, case, p, mine)
    if timed:
        yield from _timing(ctx, case, p, timed)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


SUITE = GDNOpSuite()
