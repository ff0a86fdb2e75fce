"""`gdn-op` on the ranks: one (shape, backend) case's accuracy against the reference, then its
timing beside its baseline's (what each metric means: `workers.suites.gdn_op.spec`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from gdn import GDNShape, UnsupportedGDNRequest, gated_delta_rule, get_backend, recurrent_gated_delta_rule
from gdn import device as devices
from workers.context import RankContext
from workers.measure import (
    error_samples,
    measure_peak_memory,
    tensor_error,
    time_against_reference,
    time_repeats,
    time_samples,
)
from workers.suite import Case, Sample
from workers.suites.gdn_op.spec import TENSORS
from workers.suites.shared.spec import CHUNK

# A case's tensors by name: the leaves q, k, v, g, beta, h0 (h0 None when stateless), dO and dHT
# (dHT None when stateless), the packed offsets `cu` (None unless packed); or, from a fwd+bwd,
# o, ht and the leaves' gradients (None where the leaf is).
Tensors = dict[str, torch.Tensor | None]


def run(ctx: RankContext, case: Case) -> Iterator[Sample]:
    """Accuracy (up to `accuracy_max_seq_len`), then timing of the backend beside its baseline."""
    p = dict(case.params)
    mine, base = p["backend"], p["baseline"]
    timed = [b for b in dict.fromkeys((base, mine)) if _timed(p, b)]
    timed = timed if p["timing"] and _timed(p, mine) else []
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


def fwd_bwd_flops(batch: int, seq_len: int, v_heads: int, head_dim: int = 128) -> float:
    """Matrix FLOPs of one chunked fwd+bwd (chunk 64, no recompute counted).

    Per chunk and head, multiply-adds: forward 5·C²·D + 3·C·D² (K·Kᵀ, Wk, U, Q·Kᵀ, P·Vn; Wk·S,
    Kᵀ·Vn, Q·S); backward 13·C²·D + 6·C·D² + 2·C³ (see docs/kernels.md). FLOPs = 2·MACs."""
    C, Dh = CHUNK, head_dim
    chunks = -(-seq_len // C)
    macs = (5 + 13) * C * C * Dh + (3 + 6) * C * Dh * Dh + 2 * C**3
    return 2.0 * macs * chunks * batch * v_heads


def _make_inputs(ctx: RankContext, p: Mapping[str, Any], seed: int) -> Tensors:
    """Inputs in the case dtype on the device, plus dO and dHT divided by their element count.
    A packed case (`packed`: sequence lengths) adds `cu` (int32 offsets) and one state per sequence."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    B, T, Hq, Hv, Dh = p["batch"], p["seq_len"], p["qk_heads"], p["v_heads"], p["head_dim"]
    packed = p.get("packed")
    states = len(packed) if packed else B
    dt: torch.dtype = getattr(torch, p["dtype"])

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    x: Tensors = {
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


def _call(backend: str, x: Tensors, final: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward of `backend` (any registered name) on leaves x; returns (o, final_state | None)."""
    return gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"],
        initial_state=x["h0"], output_final_state=final, cu_seqlens=x.get("cu"), backend=backend,
    )


_LEAVES = ("q", "k", "v", "g", "beta", "h0")


def _leaves(x: Tensors, dtype: torch.dtype | None = None) -> Tensors:
    """x with fresh copies of its leaves (in `dtype`, if given) that require grad."""
    out = dict(x)
    for n in _LEAVES:
        t = x[n]
        if t is not None:
            t = t.detach().clone()
            if dtype is not None:
                t = t.to(dtype)
            out[n] = t.requires_grad_(True)
    return out


def _grads(o: torch.Tensor, ht: torch.Tensor | None, leaves: Tensors) -> Tensors:
    """o and ht detached, and the leaves' gradients (`dq` ... `dh0`), after a backward."""
    res: Tensors = {"o": o.detach(), "ht": ht.detach() if ht is not None else None}
    for n in _LEAVES:
        leaf = leaves[n]
        res[f"d{n}" if n != "beta" else "dbeta"] = leaf.grad if leaf is not None else None
    return res


def _fwd_bwd(backend: str, x: Tensors, final: bool) -> Tensors:
    """Forward + backward with x's dO/dHT; returns o, ht and the leaves' gradients."""
    o, ht = _call(backend, x, final)
    outs, grads = [o], [x["do"].to(o.dtype)]
    if final and x["dht"] is not None:
        outs.append(ht)
        grads.append(x["dht"].to(ht.dtype))
    torch.autograd.backward(outs, grads)
    return _grads(o, ht, x)


def _reference(x: Tensors, p: Mapping[str, Any], final: bool) -> Tensors:
    """fp64 per-token oracle (short T) or fp32 chunked eager (long T) on the upcast inputs."""
    if p["seq_len"] <= p["oracle_max_seq_len"]:
        r = _leaves(x, torch.float64)
        r["do"], r["dht"] = x["do"].double(), None if x["dht"] is None else x["dht"].double()
        o, ht = recurrent_gated_delta_rule(
            r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["h0"], output_final_state=final,
            cu_seqlens=x.get("cu"),
        )
        outs, grads = [o], [r["do"]]
        if final and r["dht"] is not None:
            outs.append(ht)
            grads.append(r["dht"])
        torch.autograd.backward(outs, grads)
        return _grads(o, ht, r)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 reference
    try:
        r = _leaves(x, torch.float32)
        r["do"] = x["do"].float()
        return _fwd_bwd("eager", r, final)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def _accuracy(ctx: RankContext, case: Case, p: Mapping[str, Any], backend: str) -> Iterator[Sample]:
    final = p["mode"] == "stateful"
    for idx, seed in enumerate(p["accuracy_seeds"]):
        x = _make_inputs(ctx, p, seed)
        ref = _reference(x, p, final)
        got = _fwd_bwd(backend, _leaves(x), final)
        for t in TENSORS:
            mine, want = got.get(t), ref.get(t)
            if mine is None or want is None:
                continue
            for s in error_samples(ctx, case.name, t, tensor_error(mine, want)):
                yield replace(s, idx=idx)
        del got, ref, x


def _timed(p: Mapping[str, Any], b: str) -> bool:
    if b == "eager" and p["seq_len"] > p["eager_max_seq_len"]:
        return False
    timed = p.get("timed_backends")
    return timed is None or b in timed


Call = Callable[[], None]


def timed_calls(backend: str, x: Tensors, final: bool) -> tuple[Call, Call, Call]:
    """(fwd, fwd_bwd, reset) of `backend` on leaves x, the calls the timing repeats.

    Everything that is the same for every call is done here, once: the function is looked up,
    dO and dHT are cast to the outputs' dtypes (o has v's dtype, the final state is fp32) and the
    gradient list is built. `reset` drops the leaves' gradients; it runs outside the timed region
    (`time_repeats`' `before`), so a repetition is the backend's forward and backward alone.
    Every call still goes through `gdn.gated_delta_rule` and its checks, as a user's does.
    """
    q, k, v, g, beta, h0, cu = (x[n] for n in ("q", "k", "v", "g", "beta", "h0", "cu"))
    leaves = [t for n in _LEAVES if (t := x[n]) is not None]
    grads = [x["do"].to(v.dtype)]
    if final and x["dht"] is not None:
        grads.append(x["dht"].to(torch.float32))
    backward = torch.autograd.backward

    def fwd() -> None:
        gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=final, cu_seqlens=cu,
                         backend=backend)

    def fwd_bwd() -> None:
        o, ht = gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=final,
                                 cu_seqlens=cu, backend=backend)
        backward([o, ht] if len(grads) == 2 else [o], grads)

    def reset() -> None:
        for t in leaves:
            t.grad = None

    return fwd, fwd_bwd, reset


def _timing(ctx: RankContext, case: Case, p: Mapping[str, Any], backends: list[str]) -> Iterator[Sample]:
    """Times `backends` on one set of inputs; the samples are the case's backend's (the last),
    the others (its baseline) only give the ratios' denominators."""
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
        med[b] = statistics.median(times_of["fwd_bwd"])
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


def _unsupported(ctx: RankContext, p: Mapping[str, Any], backend: str) -> str | None:
    """The backend's capability check for this case (an unknown name raises, naming the known ones)."""
    n = len(p["packed"]) if p.get("packed") else None
    shape = GDNShape(p["batch"], p["seq_len"], p["qk_heads"], p["v_heads"], p["head_dim"], p["head_dim"], n)
    return get_backend(backend).unsupported(shape, getattr(torch, p["dtype"]), ctx.device)
