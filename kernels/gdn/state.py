"""Stage 3 and its backward: the state passes, sequential in chunks within a segment.

Forward: per-chunk incoming states S, Vn = U − Wk·S and the final state. Reverse: per-chunk dS'
and the full dVn, dh0. Both split the sequence into segments when `state_segments` says so."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import (
    chunk_beta,
    chunk_t,
    load_gamma,
    load_rows,
    mm,
    state_next,
    state_slot,
    value_rows,
    walk_range,
    walk_span,
)
from kernels.gdn.config import BT, D, KernelConfig, chunk_count, dot_precision, kernel_config
from kernels.gdn.dvn_local import dvn_local, local_dvn
from kernels.gdn.intra import VnFrom, t_wk, walk_vn, walk_vn_operands, wk_vn
from kernels.gdn.segments import segment_forward_summary, segment_scan, state_segments


@triton.jit
def state_grad_step(dS, q, do, wk, dvn, gam, g_last, scale):
    """The gradient entering a chunk from dS' leaving it (the reverse walk's step):
    e^{γ_C}·dS' + Qᵀ·(scale·e^γ ⊙ dO) − Wkᵀ·dVn, every operand in Wk's dtype (the gate on the
    [BT, BV] dO tile, not the [BT, D] Q tile, as `state_next` does)."""
    dt = wk.dtype
    dog = (do * (tl.exp(gam) * scale)[:, None]).to(dt)
    return dS * tl.exp(g_last) + tl.dot(tl.trans(q.to(dt)), dog) - tl.dot(tl.trans(wk), dvn.to(dt))


@triton.jit
def _state_fwd_kernel(
    k_ptr, w_ptr, u_ptr, v_ptr, beta_ptr, tm_ptr, gamma_ptr, h0_ptr, s_ptr, vn_ptr, ht_ptr, seq_ptr,
    spans_ptr, T, NT, CPS, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    VN_FROM: tl.constexpr, WITH_V: tl.constexpr, PREC: tl.constexpr, HAS_H0: tl.constexpr,
    STORE_S: tl.constexpr, STORE_VN: tl.constexpr, STORE_HT: tl.constexpr, VARLEN: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    """One segment (program_id 2) of CPS chunks: S starts from h0[bh, seg] (or 0) and walks the
    segment's chunks; the last segment writes the final state. One segment = the whole sequence.
    VARLEN (B = 1): segment n is packed sequence n, chunks seq_ptr[n] .. seq_ptr[n+1] at the
    rows of the chunk table, from h0[n, h] to ht[n, h]; no state crosses a sequence boundary.
    STORE_S: every chunk's incoming S in k's dtype, [B·Hv, NT, D, D]. VN_FROM, WITH_V, PREC: where
    each chunk's Vn comes from (`intra.walk_vn`)."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    nseg = tl.num_programs(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    k_base = k_ptr + b * T * HQK * D + hk * D
    dt = k_ptr.dtype.element_ty
    st = state_slot(bh, h, seg, nseg, HV, VARLEN)
    if HAS_H0:
        S = tl.load(h0_ptr + st * D * D + dk[:, None] * D + dv[None, :]).to(tl.float32)
    else:
        S = tl.zeros([D, BV], dtype=tl.float32)
    c0, c1, r0, r1 = walk_range(seq_ptr, spans_ptr, seg, CPS, NT, T, VARLEN)
    for c in range(c0, c1):
        if STORE_S:
            tl.store(s_ptr + (bh * NT + c) * D * D + dk[:, None] * D + dv[None, :], S.to(dt))
        t0, t1 = walk_span(c, c0, r0, r1, T, VARLEN, BT)
        t = t0 + tl.arange(0, BT)
        m = t < t1
        if VN_FROM == "t":  # K and γ enter Vn's product
            gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
            kc = load_rows(k_base, t, m, HQK * D, D)
            vn = walk_vn(S, kc, gam, w_ptr, u_ptr, v_ptr, beta_ptr, tm_ptr, bh, b, h, t, m, dv, T, HV,
                         VN_FROM, WITH_V, PREC, BT, D)
        else:  # Wk's product first, K and γ after (the order the sm_90 schedule was measured in)
            vn = wk_vn(S, w_ptr, u_ptr, v_ptr, beta_ptr, tm_ptr, bh, b, h, t, m, dv, T, HV, VN_FROM, WITH_V,
                       PREC, BT, D)
        if STORE_VN:
            tl.store(vn_ptr + (bh * T + t[:, None]) * D + dv[None, :], vn.to(dt), mask=m[:, None])
        if VN_FROM != "t":
            gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
            kc = load_rows(k_base, t, m, HQK * D, D)
        S = state_next(S, vn, kc, gam, g_last)
    if STORE_HT:
        if VARLEN:
            tl.store(ht_ptr + st * D * D + dk[:, None] * D + dv[None, :], S)
        elif seg == nseg - 1:
            tl.store(ht_ptr + bh * D * D + dk[:, None] * D + dv[None, :], S)


@triton.jit
def _state_bwd_kernel(
    q_ptr, k_ptr, w_ptr, do_ptr, dvl_ptr, gamma_ptr, dht_ptr, ds_ptr, dvn_ptr, dh0_ptr, seq_ptr, spans_ptr,
    beta_ptr, tm_ptr, scale, T, NT, CPS, SEG0, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    HAS_DHT: tl.constexpr, STORE: tl.constexpr, STORE_DH0: tl.constexpr, ALL_DH0: tl.constexpr,
    DVL_IN_STEP: tl.constexpr, WK_IN_STEP: tl.constexpr, PREC_WU: tl.constexpr, VARLEN: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    """Segment seg = SEG0 + program_id 2 of CPS chunks, walked in reverse from dht[bh, seg] (or 0).
    STORE: write dVn and every chunk's dS' in w's dtype [B·Hv, NT, D, D]. The segment's start
    gradient goes to dh0[bh, seg] when ALL_DH0 (the summary run of every segment), else segment
    0's to dh0[bh] when STORE_DH0. DVL_IN_STEP: the intra-chunk part of dVn is formed in the step
    (`local_dvn` on the K, Q, dO tiles the step loads anyway) instead of read from dvl.
    WK_IN_STEP: the step forms Wk = T·diag(βe^γ)·K at PREC_WU (`intra.t_wk`) from the chunk's T
    and the K tile instead of reading it; w_ptr then only gives the dtype.
    VARLEN (B = 1, SEG0 = 0): segment n is packed sequence n, chunks seq_ptr[n] .. seq_ptr[n+1],
    walked back from dht[n, h] to dh0[n, h]."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = SEG0 + tl.program_id(2)
    nseg = SEG0 + tl.num_programs(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    qk_off = b * T * HQK * D + hk * D
    dt = w_ptr.dtype.element_ty
    cols = dk[:, None] * D + dv[None, :]
    st = state_slot(bh, h, seg, nseg, HV, VARLEN)
    if HAS_DHT:
        dS = tl.load(dht_ptr + st * D * D + cols).to(tl.float32)
    else:
        dS = tl.zeros([D, BV], dtype=tl.float32)
    c0, c1, r0, r1 = walk_range(seq_ptr, spans_ptr, seg, CPS, NT, T, VARLEN)
    for j in range(c1 - c0):
        c = c1 - 1 - j
        if STORE:
            tl.store(ds_ptr + (bh * NT + c) * D * D + cols, dS.to(dt))
        t0, t1 = walk_span(c, c0, r0, r1, T, VARLEN, BT)
        t = t0 + tl.arange(0, BT)
        m = t < t1
        rows = (bh * T + t[:, None]) * D
        gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
        kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
        if DVL_IN_STEP:
            q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
            do = value_rows(do_ptr, b, h, t, m, dv, T, HV, D)
        dvn = tl.dot(kc, dS.to(dt)) * tl.exp(g_last - gam)[:, None]
        if DVL_IN_STEP:
            dvn += local_dvn(kc, q, do, gam, scale, BT)
        else:
            dvn += tl.load(dvl_ptr + rows + dv[None, :], mask=m[:, None], other=0.0)
        if STORE:
            tl.store(dvn_ptr + rows + dv[None, :], dvn.to(dt), mask=m[:, None])
        if not DVL_IN_STEP:
            q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
            do = value_rows(do_ptr, b, h, t, m, dv, T, HV, D)
        if WK_IN_STEP:
            tw = t_wk(chunk_t(tm_ptr, bh, t, m, T, BT), chunk_beta(beta_ptr, b, h, t, m, T, HV), gam)
            wk = mm(tw, kc.to(tl.float32), PREC_WU).to(dt)
        else:
            wk = tl.load(w_ptr + rows + dk[None, :], mask=m[:, None], other=0.0)
        dS = state_grad_step(dS, q, do, wk, dvn, gam, g_last, scale)
    if ALL_DH0:
        tl.store(dh0_ptr + st * D * D + cols, dS)
    elif STORE_DH0:
        if VARLEN:
            tl.store(dh0_ptr + st * D * D + cols, dS)
        elif seg == 0:
            tl.store(dh0_ptr + bh * D * D + cols, dS)


def state_forward(
    k: torch.Tensor,
    w: torch.Tensor | None,
    u: torch.Tensor | None,
    gamma: torch.Tensor,
    num_v_heads: int,
    initial_state: torch.Tensor | None,
    *,
    store_states: bool,
    store_vn: bool,
    store_final: bool,
    keep_maps: bool = False,
    vn_from: VnFrom | None = None,
    seq_chunks: torch.Tensor | None = None,
    spans: torch.Tensor | None = None,
    cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Per-chunk incoming states [B·Hv, NT, D, D] (k dtype), Vn [B·Hv, T, D], the final fp32 state
    and, when `keep_maps`, the segment transitions M [B·Hv, nseg, D, D] (None for one segment; the
    backward reuses them transposed).

    With nseg = `state_segments(...)` > 1 the sequence is cut into nseg runs of chunks: every
    segment's affine map (M, E) from a zero start in parallel, a scan over segments for the state
    entering each, then every segment's pass from its true state in parallel. Exact: the same
    recurrence, regrouped. u=None means V = 0 (the transition-product run of the CP summary),
    unless `vn_from` = (v, beta, T) is given: then every walk forms U's columns in its step, or,
    with w=None too, each chunk's Vn from T without Wk (`KernelConfig.walk_vn` "u" and "t").

    `seq_chunks` and `spans` (packed sequences, B = 1: `chunks.ChunkTable`): int32 chunk offsets
    of the N sequences and each chunk's rows; each sequence is walked from its own initial state
    [N, Hv, D, D] to its own final state [N, Hv, D, D], all N in parallel in one launch (they are
    the segments; no maps). `cfg`: the launch settings (default: `kernel_config(k.dtype, k.device)`)."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    B, T, Hqk, _ = k.shape
    Hv, NT = num_v_heads, chunk_count(T, seq_chunks, spans)
    dev = k.device
    n_states = B if seq_chunks is None else seq_chunks.numel() - 1
    s = torch.empty(B * Hv, NT, D, D, device=dev, dtype=k.dtype) if store_states else None
    vn = torch.empty(B * Hv, T, D, device=dev, dtype=k.dtype) if store_vn else None
    ht = torch.empty(n_states, Hv, D, D, device=dev, dtype=torch.float32) if store_final else None
    h0 = initial_state.contiguous() if initial_state is not None else None
    nseg = state_segments(B * Hv, T, dev, cfg) if seq_chunks is None else n_states
    mm = None
    if nseg > 1 and seq_chunks is None:
        mm, ee = segment_forward_summary(k, w, u, gamma, Hv, nseg, with_last=keep_maps, vn_from=vn_from,
                                         cfg=cfg)
        h0 = segment_scan(mm, ee, h0, reverse=False, cfg=cfg)
        del ee
        if not keep_maps:
            mm = None
    BV = cfg.state_bv
    _state_fwd_kernel[(D // BV, B * Hv, nseg)](
        k_ptr=k, gamma_ptr=gamma, **walk_vn_operands(w, u, vn_from, k, cfg),
        h0_ptr=h0 if h0 is not None else k, s_ptr=s if s is not None else k,
        vn_ptr=vn if vn is not None else k, ht_ptr=ht if ht is not None else k,
        seq_ptr=seq_chunks if seq_chunks is not None else k, spans_ptr=spans if spans is not None else k,
        T=T, NT=NT, CPS=triton.cdiv(NT, nseg), HQK=Hqk, HV=Hv, R=Hv // Hqk,
        HAS_H0=h0 is not None, STORE_S=store_states, STORE_VN=store_vn,
        STORE_HT=store_final, VARLEN=seq_chunks is not None, BT=BT, D=D, BV=BV,
        num_warps=cfg.state_warps, num_stages=cfg.state_stages,
    )
    return s, vn, ht, mm


def state_backward(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, do: torch.Tensor, gamma: torch.Tensor,
    dht: torch.Tensor | None, scale: float, *, want_dh0: bool, maps: torch.Tensor | None = None,
    seq_chunks: torch.Tensor | None = None, spans: torch.Tensor | None = None,
    wk_from: tuple[torch.Tensor, torch.Tensor] | None = None, cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-chunk dS at chunk ends [B·Hv, NT, D, D], full dVn [B·Hv, T, D] and dh0 (fp32) if asked.
    The walk reads Wk from `w`, or forms it in its step from `wk_from` = (β, T) (w None).

    `maps` are the forward's segment transitions (state_forward's fourth result): with them the
    reverse pass is segmented the same way. Every segment but the first walks back from a zero
    gradient (its affine part), a reverse scan carries dS over segments with Mᵀ, then every
    segment walks back from its true gradient in parallel. `seq_chunks` as in `state_forward`:
    every packed sequence walks back from its own dht [N, Hv, D, D] to its own dh0, in parallel."""
    cfg = cfg or kernel_config(q.dtype, q.device)
    B, T, Hqk, _ = q.shape
    Hv, NT = do.shape[2], chunk_count(T, seq_chunks, spans)
    R = Hv // Hqk
    if seq_chunks is not None and maps is not None:
        raise ValueError("packed sequences (seq_chunks) walk one segment per sequence: no segment maps")
    if (w is None) == (wk_from is None):
        raise ValueError("the reverse walk reads Wk from w or forms it from wk_from = (beta, T): give one")
    beta, tm = wk_from if wk_from is not None else (k, k)
    in_step = cfg.dvl_in_walk
    dvl = None if in_step else dvn_local(q, k, do, gamma, scale, spans, cfg=cfg)
    # bwd_in_place: dVn over dvl, each element read by the one program that then writes it
    in_place = dvl is not None and cfg.bwd_in_place
    dvn = dvl if in_place else torch.empty(B * Hv, T, D, device=q.device, dtype=q.dtype)
    ds = torch.empty(B * Hv, NT, D, D, device=q.device, dtype=q.dtype)
    n_states = B if seq_chunks is None else seq_chunks.numel() - 1
    dh0 = torch.empty(n_states, Hv, D, D, device=q.device, dtype=torch.float32) if want_dh0 else None
    BV = cfg.state_bv
    nseg = (1 if maps is None else maps.shape[1]) if seq_chunks is None else n_states
    w = k if w is None else w  # formed in the step: the pointer gives the dtype
    operands = dict(q_ptr=q, k_ptr=k, w_ptr=w, do_ptr=do, dvl_ptr=dvn if dvl is None else dvl,
                    beta_ptr=beta, tm_ptr=tm,
                    gamma_ptr=gamma, scale=scale, T=T, NT=NT, CPS=triton.cdiv(NT, nseg), HQK=Hqk, HV=Hv, R=R,
                    DVL_IN_STEP=in_step, WK_IN_STEP=wk_from is not None,
                    PREC_WU=dot_precision(cfg, k.dtype, "wu"), BT=BT, D=D, BV=BV, num_warps=cfg.state_warps,
                    num_stages=cfg.state_stages)
    dend = dht
    if nseg > 1 and seq_chunks is None:
        dext = torch.empty(B * Hv, nseg, D, D, device=q.device, dtype=torch.float32)
        _state_bwd_kernel[(D // BV, B * Hv, nseg - 1)](
            dht_ptr=w, ds_ptr=w, dvn_ptr=w, dh0_ptr=dext, seq_ptr=w, spans_ptr=w, SEG0=1,
            HAS_DHT=False, STORE=False, STORE_DH0=False, ALL_DH0=True, VARLEN=False, **operands,
        )
        dend = segment_scan(maps, dext, dht, reverse=True, cfg=cfg)
        del dext
    _state_bwd_kernel[(D // BV, B * Hv, nseg)](
        dht_ptr=dend if dend is not None else w, ds_ptr=ds, dvn_ptr=dvn,
        dh0_ptr=dh0 if dh0 is not None else w, seq_ptr=seq_chunks if seq_chunks is not None else w,
        spans_ptr=spans if spans is not None else w, SEG0=0,
        HAS_DHT=dend is not None, STORE=True, STORE_DH0=want_dh0, ALL_DH0=False,
        VARLEN=seq_chunks is not None, **operands,
    )
    return ds, dvn, dh0
