"""`cp-layer` on the ranks: one candidate (CP mode + backend) of the layer against the no-CP layer
(what each metric means: `workers.suites.cp_layer.spec`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from itertools import accumulate
from typing import Any

import torch

from gdn import device as devices
from gdn.cp import CPConfig, CPError
from gdn.cp.config import packed_shard_misfit, shard_sequence, ulysses_misfit
from gdn.cp.emulation import EmulationStats, emulated_p2p_layer
from gdn.layer import GDNLayerConfig
from workers.context import RankContext
from workers.harness.cp_compare import (
    LayerCase,
    LayerComparison,
    build_layer,
    compare_emulated,
    compare_layer,
    compare_no_cp,
    make_inputs,
)
from workers.measure import (
    error_samples,
    measure_peak_memory,
    tensor_error,
    time_repeats,
    time_samples,
    worst_rel_l2,
)
from workers.suite import Case, Sample
from workers.suites.cp_layer.spec import LAYER_PARAMS
from workers.verdict import relative_l2

Call = Callable[[], None]


def run(ctx: RankContext, case: Case) -> Iterator[Sample]:
    p = dict(case.params)
    lc = _layer_case(ctx, p)
    if p["mode"] in ("p2p_emulated", "none"):  # in this process, whatever the world size
        yield from list(_in_process(ctx, case.name, p, lc))
        devices.empty_cache(ctx.device)
        if p["seq_len"] <= p["accuracy_max_seq_len"]:
            cmp = (compare_no_cp(lc, ctx.device) if p["mode"] == "none"
                   else compare_emulated(lc, p["shards"], ctx.device))
            yield from _accuracy_samples(ctx, case.name, lc, cmp)
        return
    if not ctx.distributed:
        raise CPError(
            f"CP mode {p['mode']!r} needs a job with world size >= 2 (got {ctx.world_size}); "
            "on one device use the 'p2p_emulated' candidate"
        )
    timeout = timedelta(seconds=p["transfer_timeout_s"])
    cp = CPConfig(p["mode"], ctx.group, timeout=timeout, early_state=p["p2p_early_state"])
    cp.check_world_size(ctx.world_size)
    yield from list(_candidate(ctx, case.name, p, lc, cp))  # its tensors are freed on return
    devices.empty_cache(ctx.device)
    if p["seq_len"] <= p["accuracy_max_seq_len"]:
        yield from _accuracy_samples(ctx, case.name, lc, compare_layer(lc, cp, ctx.device))


def not_applicable(case: Case, world_size: int) -> str | None:
    """Ulysses whose heads do not split over the ranks; AllGather with a packed sequence across a
    rank boundary (gdn.cp.config names which)."""
    p = case.params
    if world_size == 1 or p.get("mode") not in ("ulysses", "all_gather"):
        return None
    if p["mode"] == "ulysses":
        return ulysses_misfit(p["qk_heads"], p["v_heads"], world_size)
    if p.get("packed") and p["seq_len"] % world_size == 0:  # else the layer names the misfit
        return packed_shard_misfit(_offsets(p), p["seq_len"] // world_size, world_size, "all_gather")
    return None


def _offsets(p: Mapping[str, Any]) -> list[int]:
    """A packed case's `cu_seqlens` offsets [0, ..., seq_len]."""
    return [0, *accumulate(p["packed"])]


def _aligned(p: Mapping[str, Any], shards: int) -> bool:
    """A packed case whose every shard boundary (of `shards` equal shards) is a sequence boundary:
    the sequence-sharded modes then run each shard alone, with no state or halo message."""
    if not p.get("packed"):
        return False
    return packed_shard_misfit(_offsets(p), p["seq_len"] // shards, shards, "p2p") is None


def _layer_case(ctx: RankContext, p: Mapping[str, Any]) -> LayerCase:
    cfg = GDNLayerConfig(
        hidden_size=p["hidden_size"], num_qk_heads=p["qk_heads"], num_v_heads=p["v_heads"],
        head_dim=p["head_dim"], conv_size=p["conv_size"],
    )
    dtype: torch.dtype = getattr(torch, p["dtype"])
    ref_dtype: torch.dtype = dtype if p["ref_dtype"] == "same" else getattr(torch, p["ref_dtype"])
    return LayerCase(
        cfg, p["mode"], backend=p["backend"], ref_backend=p["ref_backend"], dtype=dtype, ref_dtype=ref_dtype,
        batch=p["batch"], seq_len=p["seq_len"], valid_len=p["valid_len"], seed=ctx.seed,
        packed=tuple(p["packed"]) if p.get("packed") else None,
    )


def expected_hops(mode: str, rank: int, size: int, aligned: bool = False) -> dict[str, int]:
    """Messages (sent + received) one fwd+bwd makes on `rank` of `size`, per kind; `aligned`: a
    packing whose rank boundaries are sequence boundaries (see `_aligned`)."""
    if size == 1 or mode in ("ulysses", "none") or aligned:
        return {"state_fwd": 0, "state_bwd": 0, "halo": 0}
    neighbours = (rank > 0) + (rank < size - 1)
    state = neighbours if mode == "p2p" else 0
    return {"state_fwd": state, "state_bwd": state, "halo": 2 * neighbours}


def _candidate(
    ctx: RankContext, name: str, p: Mapping[str, Any], lc: LayerCase, cp: CPConfig
) -> Iterator[Sample]:
    """Chain counts of one fwd+bwd, then timing and memory of the candidate layer alone."""
    layer = build_layer(lc, cp, lc.backend, ctx.device)
    x, mask, dy = make_inputs(lc, ctx.device)
    x_loc = shard_sequence(x, cp, 1).clone().requires_grad_(True)
    m_loc = None if mask is None else shard_sequence(mask, cp, 1)
    dy_loc = shard_sequence(dy, cp, 1).clone()
    cu = lc.cu_seqlens(ctx.device)
    del x, mask, dy

    def fwd() -> None:
        layer(x_loc, m_loc, cu)

    def reset() -> None:
        layer.zero_grad(set_to_none=True)
        x_loc.grad = None

    def fwd_bwd() -> None:
        layer(x_loc, m_loc, cu).backward(dy_loc)

    # The first call (shape check, Triton compile) makes a rank wait for its peer's compile: the
    # counters and the chain wait come from a second call with fresh counters.
    fwd_bwd()
    devices.synchronize(ctx.device)
    cp.stats.reset()
    reset()
    fwd_bwd()
    devices.synchronize(ctx.device)
    s, r = cp.stats.sent, cp.stats.received
    got = {
        "state_fwd": s.get("state_fwd", 0) + r.get("state_fwd", 0),
        "state_bwd": s.get("state_bwd", 0) + r.get("state_bwd", 0),
        "halo": sum(s.get(k, 0) + r.get(k, 0) for k in ("halo_fwd", "halo_bwd")),
    }
    yield Sample(name, "hops_state_fwd", got["state_fwd"], rank=ctx.rank)
    yield Sample(name, "hops_state_bwd", got["state_bwd"], rank=ctx.rank)
    yield Sample(name, "hops_halo", got["halo"], rank=ctx.rank)
    ok = got == expected_hops(p["mode"], cp.rank, cp.world_size, _aligned(p, cp.world_size))
    yield Sample(name, "hop_counts_ok", 1.0 if ok else 0.0, rank=ctx.rank)
    yield Sample(name, "order_checks", cp.stats.order_checks, rank=ctx.rank)
    wait = cp.stats.wait_ms.get("state_fwd", 0.0) + cp.stats.wait_ms.get("state_bwd", 0.0)
    yield Sample(name, "chain_wait_ms", wait, rank=ctx.rank)
    if p["timing"]:
        yield from _timing(ctx, name, p, fwd, fwd_bwd, reset)


def _timing(
    ctx: RankContext, name: str, p: Mapping[str, Any], fwd: Call, fwd_bwd: Call, reset: Call
) -> Iterator[Sample]:
    """fwd and fwd+bwd repetitions (`reset` drops the gradients between them, untimed) and the
    full-process peak memory of one fwd+bwd."""
    with torch.enable_grad():
        t_fwd = time_repeats(ctx, fwd, warmup=p["warmup"], repeat=p["repeat"])
        t_fb = time_repeats(ctx, fwd_bwd, warmup=p["warmup"], repeat=p["repeat"], before=reset)
        reset()
        mem = measure_peak_memory(ctx, fwd_bwd, incremental=False)
    yield from time_samples(ctx, name, "fwd_ms", t_fwd)
    yield from time_samples(ctx, name, "fwd_bwd_ms", t_fb)
    if mem.tracked:
        yield Sample(name, "peak_allocated_bytes", float(mem.peak_allocated), rank=ctx.rank)
        yield Sample(name, "peak_reserved_bytes", float(mem.peak_reserved), rank=ctx.rank)


def _in_process(ctx: RankContext, name: str, p: Mapping[str, Any], lc: LayerCase) -> Iterator[Sample]:
    """Hops and timing of the single-process P2P emulation (serial: not a CP speed, a regression
    series for the summary and chain kernels), or timing of the no-CP layer (mode `none`)."""
    layer = build_layer(lc, None, lc.backend, ctx.device)
    x, mask, dy = make_inputs(lc, ctx.device)
    cu = lc.cu_seqlens(ctx.device)
    x.requires_grad_(True)
    stats = EmulationStats()
    emulated = p["mode"] == "p2p_emulated"

    def forward(counted: EmulationStats | None = None) -> torch.Tensor:
        if emulated:
            return emulated_p2p_layer(layer, x, mask, num_shards=p["shards"], stats=counted, cu_seqlens=cu)
        return layer(x, mask, cu)

    def fwd() -> None:
        forward()

    def reset() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None

    def fwd_bwd() -> None:
        forward().backward(dy)

    if emulated:
        layer.zero_grad(set_to_none=True)
        forward(stats).backward(dy)
        devices.synchronize(ctx.device)
        hops = 0 if _aligned(p, p["shards"]) else p["shards"] - 1
        yield Sample(name, "hops_state_fwd", stats.forward_hops, rank=ctx.rank)
        yield Sample(name, "hop_counts_ok", 1.0 if stats.forward_hops == hops else 0.0, rank=ctx.rank)
    if p["timing"]:
        yield from _timing(ctx, name, p, fwd, fwd_bwd, reset)


def _accuracy_samples(ctx: RankContext, name: str, lc: LayerCase, cmp: LayerComparison) -> Iterator[Sample]:
    yield from error_samples(ctx, name, "output", tensor_error(*cmp.output))
    yield from error_samples(ctx, name, "input_grad", tensor_error(*cmp.input_grad))
    names = sorted(cmp.param_grads)
    if tuple(names) != LAYER_PARAMS:
        raise RuntimeError(f"the layer's parameters changed: {names}; update LAYER_PARAMS to match")
    flat_a = torch.cat([cmp.param_grads[n][0].double().flatten() for n in names])
    flat_b = torch.cat([cmp.param_grads[n][1].double().flatten() for n in names])
    yield from error_samples(ctx, name, "param_grad", tensor_error(flat_a, flat_b))
    errs = worst_rel_l2(cmp)  # output, input_grad and param:<name>, each against the reference
    each = [errs[f"param:{n}"] for n in names]
    for idx, err in enumerate(each):
        yield Sample(name, "param_grad_rel_l2_by_param", err, rank=ctx.rank, idx=idx)
    worst = max(each)
    yield Sample(name, "param_grad_worst_rel_l2", worst, rank=ctx.rank)
    own = errs if cmp.plain is None else worst_rel_l2(cmp.plain)
    yield Sample(name, "cp_worst_rel_l2", max(own.values()), rank=ctx.rank)
    if lc.dtype == torch.float64 and (lc.ref_dtype or lc.dtype) == torch.float64:
        yield Sample(name, "fp64_worst_rel_l2", max(errs.values()), rank=ctx.rank)
    g_cp, g_ref = cmp.grad_norm
    yield Sample(name, "grad_norm_rel_err", relative_l2(abs(g_cp - g_ref), abs(g_ref)), rank=ctx.rank)
    yield Sample(name, "padding_output_max_abs", cmp.padding_max_abs, rank=ctx.rank)
