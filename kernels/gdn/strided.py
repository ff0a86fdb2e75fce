"""States at a stride: chunk-group programs re-walk their chunks from the state the forward walk
stored at the group's start, chunk-parallel across groups.

With `state_stride` = k the forward walk (`state_forward(stride=k)`) keeps only the fp32 state
entering every group of k chunks. One program per (group, value slice, head) loads that state and
steps through the group's chunks as the walk does (Vn = U − Wk·S, S' = e^{γ_C}·S + Kdᵀ·Vn, the
same products and roundings, so S and Vn are the walk's bit for bit at the same value-slice width);
per chunk it forms the output O = scale·(e^γ·Q·S + (Q·Kᵀ ⊙ E)·Vn) on chip.

The group backward (`group_backward`) re-walks S forward from the same group states and dS' back
from the fp32 gradient leaving each group, and runs bwd_dqk's kernel on S and dS' a wave of groups
at a time through a scratch sized by the wave: no per-chunk S or dS' tensor of the sequence exists."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_span, group_chunks, load_gamma, load_rows, state_next
from kernels.gdn.config import BT, D, KernelConfig, kernel_config, num_chunks
from kernels.gdn.dqk import _bwd_dqk_kernel, dqk_buffers
from kernels.gdn.state import state_grad_step


@triton.jit
def _state_group_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, gamma_ptr, sb_ptr, o_ptr, groups_ptr, spans_ptr, scale,
    T, NT, NG, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, STRIDE: tl.constexpr,
    VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    """Group g (program_id 0) of value slice iv (1) of head bh (2): from sb[bh, g] through the
    group's chunks (dense: g·STRIDE .. +STRIDE, cut at NT; VARLEN: groups_ptr[g], chunk rows from
    the chunk table), writing O of every chunk."""
    g = tl.program_id(0)
    iv = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    i = tl.arange(0, BT)
    qk_off = b * T * HQK * D + hk * D
    dt = w_ptr.dtype.element_ty
    c0, c1 = group_chunks(groups_ptr, g, NT, STRIDE, VARLEN)
    S = tl.load(sb_ptr + (bh * NG + g) * D * D + dk[:, None] * D + dv[None, :])
    causal = i[:, None] >= i[None, :]
    for c in range(c0, c1):
        t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
        t = t0 + i
        m = t < t1
        vn = group_vn(S, w_ptr, u_ptr, bh, t, m, T, dv, D)
        gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
        kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
        q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
        p = tl.dot(q, tl.trans(kc))
        p = tl.where(causal, p * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
        o = tl.dot(q, S.to(dt)) * tl.exp(gam)[:, None] + tl.dot(p.to(dt), vn.to(dt))
        o_off = ((b * T + t[:, None]) * HV + h) * D + dv[None, :]
        tl.store(o_ptr + o_off, (o * scale).to(o_ptr.dtype.element_ty), mask=m[:, None])
        S = state_next(S, vn, kc, gam, g_last)


@triton.jit
def group_vn(S, w_ptr, u_ptr, bh, t, m, T, dv, D: tl.constexpr):
    """Vn = U − Wk·S of the chunk at rows t (mask m), value columns dv: the walk's product, with S
    rounded to Wk's dtype as the walk rounds it."""
    dk = tl.arange(0, D)
    rows = (bh * T + t[:, None]) * D
    wk = tl.load(w_ptr + rows + dk[None, :], mask=m[:, None], other=0.0)
    vn = -tl.dot(wk, S.to(wk.dtype))
    vn += tl.load(u_ptr + rows + dv[None, :], mask=m[:, None], other=0.0)
    return vn


@triton.jit
def _group_walks_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, do_ptr, dvn_ptr, gamma_ptr, sb_ptr, dsb_ptr, s_ptr, ds_ptr,
    groups_ptr, spans_ptr, scale, T, NT, NG, G0, NTS, HQK: tl.constexpr, HV: tl.constexpr,
    R: tl.constexpr, STRIDE: tl.constexpr, VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr,
    BV: tl.constexpr,
):
    """The re-walks of one wave of groups, G0 + program_id 0, for head bh (program_id 2). Value
    slice iv = program_id 1 (of 2·D/BV): iv < D/BV walks S forward from sb[bh, g] (the forward
    walk's products and roundings), writing each chunk's S (w's dtype) into the wave's scratch
    s [B·Hv, NTS, D, D] at slot chunk − the wave's first chunk, and Vn over U in place; iv >= D/BV
    walks dS' back from dsb[bh, g] (the reverse walk's step, dVn read as that walk stored it) over
    value slice iv − D/BV, writing each chunk's dS' into ds at the same slot."""
    g = G0 + tl.program_id(0)
    j = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // HV, bh % HV
    qk_off = b * T * HQK * D + (h // R) * D
    dk = tl.arange(0, D)
    i = tl.arange(0, BT)
    dt = w_ptr.dtype.element_ty
    dv = (j % (D // BV)) * BV + tl.arange(0, BV)
    cols = dk[:, None] * D + dv[None, :]
    cw, _cw_end = group_chunks(groups_ptr, G0, NT, STRIDE, VARLEN)
    c0, c1 = group_chunks(groups_ptr, g, NT, STRIDE, VARLEN)
    slots = bh * NTS - cw  # chunk c's slot in the scratch is slots + c
    if j < D // BV:
        S = tl.load(sb_ptr + (bh * NG + g) * D * D + cols)
        for c in range(c0, c1):
            t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
            t = t0 + i
            m = t < t1
            tl.store(s_ptr + (slots + c) * D * D + cols, S.to(dt))
            vn = group_vn(S, w_ptr, u_ptr, bh, t, m, T, dv, D)
            tl.store(u_ptr + (bh * T + t[:, None]) * D + dv[None, :], vn.to(dt), mask=m[:, None])
            gam, g_last, _m = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
            kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
            S = state_next(S, vn, kc, gam, g_last)
    else:
        dS = tl.load(dsb_ptr + (bh * NG + g) * D * D + cols)
        for jj in range(c1 - c0):
            c = c1 - 1 - jj
            t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
            t = t0 + i
            m = t < t1
            rows = (bh * T + t[:, None]) * D
            tl.store(ds_ptr + (slots + c) * D * D + cols, dS.to(dt))
            gam, g_last, _m = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
            q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
            do = tl.load(do_ptr + ((b * T + t[:, None]) * HV + h) * D + dv[None, :], mask=m[:, None],
                         other=0.0)
            wk = tl.load(w_ptr + rows + dk[None, :], mask=m[:, None], other=0.0)
            dvn = tl.load(dvn_ptr + rows + dv[None, :], mask=m[:, None], other=0.0)
            dS = state_grad_step(dS, q, do, wk, dvn, gam, g_last, scale)


def state_groups(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, gamma: torch.Tensor,
    sb: torch.Tensor, num_v_heads: int, scale: float, *, stride: int, out_dtype: torch.dtype,
    spans: torch.Tensor | None = None, groups: torch.Tensor | None = None,
    cfg: KernelConfig | None = None,
) -> torch.Tensor:
    """o [B, T, Hv, D] in `out_dtype` from the group-entry states `sb` [B·Hv, NG, D, D] fp32
    (`state_forward(stride=...)`), without per-chunk S or Vn in memory. Packed sequences: `spans`
    and `groups` (`ChunkTable.groups`), the groups then never crossing a sequence."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    if stride < 1:
        raise ValueError(f"stride = {stride}: the states at a stride need a group of at least 1 chunk")
    if (spans is None) != (groups is None):
        raise ValueError("packed sequences need both spans and groups (ChunkTable.groups), "
                         f"got spans={spans is not None}, groups={groups is not None}")
    B, T, Hqk, _ = k.shape
    Hv, NT, NG = num_v_heads, num_chunks(T, spans), sb.shape[1]
    o = torch.empty(B, T, Hv, D, device=k.device, dtype=out_dtype)
    BV = cfg.stride_bv
    _state_group_kernel[(NG, D // BV, B * Hv)](
        q_ptr=q, k_ptr=k, w_ptr=w, u_ptr=u, gamma_ptr=gamma, sb_ptr=sb, o_ptr=o,
        groups_ptr=groups if groups is not None else w, spans_ptr=spans if spans is not None else w,
        scale=scale, T=T, NT=NT, NG=NG, HQK=Hqk, HV=Hv, R=Hv // Hqk, STRIDE=stride,
        VARLEN=spans is not None, BT=BT, D=D, BV=BV,
        num_warps=cfg.stride_warps, num_stages=cfg.stride_stages,
    )
    return o



def wave_groups(groups: int, heads: int, stride: int, device: torch.device, cfg: KernelConfig) -> int:
    """Groups per wave of the group backward: cfg.stride_bwd_wave when > 0, else as many as give
    about cfg.stride_bwd_wave_per_sm (chunk, head) pairs per multiprocessor (a CPU counts as one);
    at least 1, never more than the groups."""
    if cfg.stride_bwd_wave > 0:
        return min(groups, cfg.stride_bwd_wave)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    return max(1, min(groups, cfg.stride_bwd_wave_per_sm * sms // (heads * stride)))


def group_backward(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, do: torch.Tensor,
    dvn: torch.Tensor, gamma: torch.Tensor, sb: torch.Tensor, dsb: torch.Tensor, num_v_heads: int,
    scale: float, *, stride: int, spans: torch.Tensor | None = None, groups: torch.Tensor | None = None,
    cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`bwd_dqk`'s results (dq, dk partial, dWk, dγ partials) from the group states instead of
    per-chunk ones: `sb` the fp32 state entering each group (`state_forward(stride=...)`), `dsb`
    the fp32 dS' leaving it (`state_backward(stride=...)`), `u` U, overwritten with Vn. No per-chunk
    S or dS' tensor of the sequence exists: the groups go in waves of W (`wave_groups`), and per
    wave `_group_walks_kernel` re-walks S and dS' of its groups into a scratch of W·stride chunk
    states per head, then `_bwd_dqk_kernel` (bwd_dqk's kernel at its own settings, one launch per
    value head of a group as in `bwd_dqk`) reads them from there. Packed sequences: `spans` and
    `groups` as in `state_groups`."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    if stride < 1:
        raise ValueError(f"stride = {stride}: the group backward needs a group of at least 1 chunk")
    if (spans is None) != (groups is None):
        raise ValueError("packed sequences need both spans and groups (ChunkTable.groups), "
                         f"got spans={spans is not None}, groups={groups is not None}")
    B, T, Hqk, _ = q.shape
    Hv, NT, NG = num_v_heads, num_chunks(T, spans), sb.shape[1]
    R = Hv // Hqk
    if dsb.shape != sb.shape:
        raise ValueError(f"group gradients {tuple(dsb.shape)} do not match the group states "
                         f"{tuple(sb.shape)}")
    BK, BV = cfg.dqk_bk, cfg.state_bv
    dq, dkp, dw, dgam = dqk_buffers(q, Hv, cfg, BK)
    wave = wave_groups(NG, B * Hv, stride, k.device, cfg)
    NTS = wave * stride  # scratch chunks per head: a wave's groups hold at most this many
    s = torch.empty(B * Hv, NTS, D, D, device=k.device, dtype=w.dtype)
    ds = torch.empty_like(s)
    common = dict(q_ptr=q, k_ptr=k, do_ptr=do, dvn_ptr=dvn, gamma_ptr=gamma, s_ptr=s, ds_ptr=ds,
                  groups_ptr=groups if groups is not None else w,
                  spans_ptr=spans if spans is not None else w, scale=scale, T=T, NT=NT, NTS=NTS,
                  HQK=Hqk, HV=Hv, R=R, STRIDE=stride, VARLEN=spans is not None, BT=BT, D=D)
    for g0 in range(0, NG, wave):
        g1 = min(g0 + wave, NG)
        _group_walks_kernel[(g1 - g0, 2 * (D // BV), B * Hv)](
            w_ptr=w, u_ptr=u, sb_ptr=sb, dsb_ptr=dsb, NG=NG, G0=g0, BV=BV,
            num_warps=cfg.stride_bwd_warps, num_stages=cfg.stride_bwd_stages, **common,
        )
        for r in range(R):
            _bwd_dqk_kernel[((g1 - g0) * stride, D // BK, B * Hqk)](
                vn_ptr=u, dq_ptr=dq, dk_ptr=dkp, dw_ptr=dw, dgam_ptr=dgam, G0=g0, G1=g1, r=r,
                CARRY_IN=r > 0, CARRY_OUT=r < R - 1, WAVE=True, BK=BK, BV=cfg.dqk_bv,
                num_warps=cfg.dqk_warps, **common,
            )
    return dq, dkp, dw, dgam
