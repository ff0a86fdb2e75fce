"""States at a stride: chunk-group programs re-walk their chunks from the state the forward walk
stored at the group's start, chunk-parallel across groups.

With `state_stride` = k the forward walk (`state_forward(stride=k)`) keeps only the fp32 state
entering every group of k chunks. One program per (group, value slice, head) loads that state and
steps through the group's chunks as the walk does (Vn = U − Wk·S, S' = e^{γ_C}·S + Kdᵀ·Vn, the
same products and roundings, so S and Vn are the walk's bit for bit at the same value-slice width);
per chunk it forms the output O = scale·(e^γ·Q·S + (Q·Kᵀ ⊙ E)·Vn) on chip (forward), or writes the
chunk's S and Vn for the backward's bwd_dqk (backward, which recomputes them here instead of
keeping them from the forward)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_span, load_gamma, load_rows
from kernels.gdn.config import BT, D, KernelConfig, kernel_config, num_chunks
from kernels.gdn.dqk import dqk_buffers, dqk_chunk
from kernels.gdn.state import state_grad_step


@triton.jit
def _state_group_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, gamma_ptr, sb_ptr, o_ptr, s_ptr, vn_ptr, groups_ptr, spans_ptr, scale,
    T, NT, NG, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, STRIDE: tl.constexpr,
    WANT_O: tl.constexpr, STORE: tl.constexpr, VARLEN: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    """Group g (program_id 0) of value slice iv (1) of head bh (2): from sb[bh, g] through the
    group's chunks (dense: g·STRIDE .. +STRIDE, cut at NT; VARLEN: groups_ptr[g], chunk rows from
    the chunk table). WANT_O: write O of every chunk; STORE: write every chunk's incoming S (w's
    dtype, [B·Hv, NT, D, D]) and Vn."""
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
    cols = dk[:, None] * D + dv[None, :]
    if VARLEN:
        c0 = tl.load(groups_ptr + 2 * g)
        c1 = tl.load(groups_ptr + 2 * g + 1)
    else:
        c0 = g * STRIDE
        c1 = tl.minimum(c0 + STRIDE, NT)
    S = tl.load(sb_ptr + (bh * NG + g) * D * D + cols)
    causal = i[:, None] >= i[None, :]
    for c in range(c0, c1):
        t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
        t = t0 + i
        m = t < t1
        if STORE:
            tl.store(s_ptr + (bh * NT + c) * D * D + cols, S.to(dt))
        vn = group_vn(S, w_ptr, u_ptr, bh, t, m, T, dv, D)
        if STORE:
            tl.store(vn_ptr + (bh * T + t[:, None]) * D + dv[None, :], vn.to(dt), mask=m[:, None])
        gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
        kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
        if WANT_O:
            q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
            p = tl.dot(q, tl.trans(kc))
            p = tl.where(causal, p * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
            o = tl.dot(q, S.to(dt)) * tl.exp(gam)[:, None] + tl.dot(p.to(dt), vn.to(dt))
            o_off = ((b * T + t[:, None]) * HV + h) * D + dv[None, :]
            tl.store(o_ptr + o_off, (o * scale).to(o_ptr.dtype.element_ty), mask=m[:, None])
        S = group_next(S, vn, kc, gam, g_last)


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
def group_next(S, vn, kc, gam, g_last):
    """The state leaving the chunk, e^{γ_C}·S + (K ⊙ e^{γ_C−γ})ᵀ·Vn, with the walk's roundings
    (operands in K's dtype, which Wk shares)."""
    dt = kc.dtype
    kd = (kc * tl.exp(g_last - gam)[:, None]).to(dt)
    return S * tl.exp(g_last) + tl.dot(tl.trans(kd), vn.to(dt))


@triton.jit
def _group_bwd_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, do_ptr, dvn_ptr, gamma_ptr, sb_ptr, dsb_ptr, scr_ptr,
    dq_ptr, dk_ptr, dw_ptr, dgam_ptr, groups_ptr, spans_ptr, scale,
    T, NT, NG, NBH, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, DQ_HEADS: tl.constexpr,
    STRIDE: tl.constexpr, VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
    BK: tl.constexpr, BVQ: tl.constexpr,
):
    """bwd_dqk's work for every chunk of the (group, head) items pid, pid + P, ... (P programs,
    persistent). Per item and value slice of BV columns: S re-walked forward from sb[bh, g] (each
    chunk's S into this program's scratch, Vn over U in place), then dS' re-walked back from
    dsb[bh, g] (each chunk's dS' into the scratch; dVn read as the reverse walk stored it); then
    `dqk_chunk` per chunk and key slice from the scratch. The scratch, [P, 2, STRIDE, D, D] in w's
    dtype, is the only memory the per-chunk S and dS' pass through."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    dk = tl.arange(0, D)
    i = tl.arange(0, BT)
    dt = w_ptr.dtype.element_ty
    scr_s = scr_ptr + pid.to(tl.int64) * 2 * STRIDE * D * D
    scr_g = scr_s + STRIDE * D * D
    for item in range(pid, NG * NBH, P):
        g = item % NG
        bh = (item // NG).to(tl.int64)
        b, h = bh // HV, bh % HV
        qk_off = b * T * HQK * D + (h // R) * D
        if VARLEN:
            c0 = tl.load(groups_ptr + 2 * g)
            c1 = tl.load(groups_ptr + 2 * g + 1)
        else:
            c0 = g * STRIDE
            c1 = tl.minimum(c0 + STRIDE, NT)
        for iv in range(D // BV):
            dv = iv * BV + tl.arange(0, BV)
            cols = dk[:, None] * D + dv[None, :]
            S = tl.load(sb_ptr + (bh * NG + g) * D * D + cols)
            for c in range(c0, c1):
                t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
                t = t0 + i
                m = t < t1
                tl.store(scr_s + (c - c0) * D * D + cols, S.to(dt))
                vn = group_vn(S, w_ptr, u_ptr, bh, t, m, T, dv, D)
                tl.store(u_ptr + (bh * T + t[:, None]) * D + dv[None, :], vn.to(dt), mask=m[:, None])
                gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
                kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
                S = group_next(S, vn, kc, gam, g_last)
            dS = tl.load(dsb_ptr + (bh * NG + g) * D * D + cols)
            for j in range(c1 - c0):
                c = c1 - 1 - j
                t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
                t = t0 + i
                m = t < t1
                rows = (bh * T + t[:, None]) * D
                tl.store(scr_g + (c - c0) * D * D + cols, dS.to(dt))
                gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
                q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
                do = tl.load(do_ptr + ((b * T + t[:, None]) * HV + h) * D + dv[None, :], mask=m[:, None],
                             other=0.0)
                wk = tl.load(w_ptr + rows + dk[None, :], mask=m[:, None], other=0.0)
                dvn = tl.load(dvn_ptr + rows + dv[None, :], mask=m[:, None], other=0.0)
                dS = state_grad_step(dS, q, do, wk, dvn, gam, g_last, scale)
        tl.debug_barrier()  # every slice's S, dS' and Vn stored before any is read back
        for c in range(c0, c1):
            t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
            for ik in range(D // BK):
                dqk_chunk(
                    q_ptr, k_ptr, u_ptr, do_ptr, dvn_ptr, scr_s + (c - c0) * D * D, scr_g + (c - c0) * D * D,
                    gamma_ptr, dq_ptr, dk_ptr, dw_ptr, dgam_ptr, scale, ik, bh, NBH, t0, t1, T,
                    HQK, HV, R, DQ_HEADS, BT, D, BK, BVQ,
                )
        tl.debug_barrier()  # every read of the scratch done before the next item overwrites it


def state_groups(
    q: torch.Tensor | None, k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, gamma: torch.Tensor,
    sb: torch.Tensor, num_v_heads: int, scale: float, *, stride: int, out_dtype: torch.dtype | None,
    store_states: bool, spans: torch.Tensor | None = None, groups: torch.Tensor | None = None,
    cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """From the group-entry states `sb` [B·Hv, NG, D, D] fp32 (`state_forward(stride=...)`): o
    [B, T, Hv, D] in `out_dtype` (None: no output, q unread) and, when `store_states`, per-chunk
    incoming S [B·Hv, NT, D, D] and Vn [B·Hv, T, D] in k's dtype. Packed sequences: `spans` and
    `groups` (`ChunkTable.groups`), the groups then never crossing a sequence."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    if stride < 1:
        raise ValueError(f"stride = {stride}: the states at a stride need a group of at least 1 chunk")
    if (spans is None) != (groups is None):
        raise ValueError("packed sequences need both spans and groups (ChunkTable.groups), "
                         f"got spans={spans is not None}, groups={groups is not None}")
    B, T, Hqk, _ = k.shape
    Hv, NT, NG = num_v_heads, num_chunks(T, spans), sb.shape[1]
    want_o = out_dtype is not None
    if want_o and q is None:
        raise ValueError("the output needs q")
    o = torch.empty(B, T, Hv, D, device=k.device, dtype=out_dtype) if want_o else None
    s = torch.empty(B * Hv, NT, D, D, device=k.device, dtype=k.dtype) if store_states else None
    vn = torch.empty(B * Hv, T, D, device=k.device, dtype=k.dtype) if store_states else None
    BV = cfg.stride_bv
    _state_group_kernel[(NG, D // BV, B * Hv)](
        q_ptr=q if q is not None else k, k_ptr=k, w_ptr=w, u_ptr=u, gamma_ptr=gamma, sb_ptr=sb,
        o_ptr=o if o is not None else w, s_ptr=s if s is not None else w, vn_ptr=vn if vn is not None else w,
        groups_ptr=groups if groups is not None else w, spans_ptr=spans if spans is not None else w,
        scale=scale, T=T, NT=NT, NG=NG, HQK=Hqk, HV=Hv, R=Hv // Hqk, STRIDE=stride, WANT_O=want_o,
        STORE=store_states, VARLEN=spans is not None, BT=BT, D=D, BV=BV,
        num_warps=cfg.stride_warps, num_stages=cfg.stride_stages,
    )
    return o, s, vn



def group_programs(items: int, device: torch.device, cfg: KernelConfig) -> int:
    """Programs of the persistent group backward: cfg.stride_bwd_programs when > 0, else about
    cfg.stride_bwd_per_sm per multiprocessor (a CPU counts as one), never more than the items."""
    if cfg.stride_bwd_programs > 0:
        return min(items, cfg.stride_bwd_programs)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    return max(1, min(items, cfg.stride_bwd_per_sm * sms))


def group_backward(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, do: torch.Tensor,
    dvn: torch.Tensor, gamma: torch.Tensor, sb: torch.Tensor, dsb: torch.Tensor, num_v_heads: int,
    scale: float, *, stride: int, spans: torch.Tensor | None = None, groups: torch.Tensor | None = None,
    cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`bwd_dqk`'s results (dq, dk partial, dWk, dγ partials) from the group states instead of
    per-chunk ones: `sb` the fp32 state entering each group (`state_forward(stride=...)`), `dsb`
    the fp32 dS' leaving it (`state_backward(stride=...)`), `u` U, overwritten with Vn. No per-chunk
    S or dS' tensor exists: each program re-walks its groups through its own scratch of
    2·stride chunk states. Packed sequences: `spans` and `groups` as in `state_groups`."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    if stride < 1:
        raise ValueError(f"stride = {stride}: the group backward needs a group of at least 1 chunk")
    if (spans is None) != (groups is None):
        raise ValueError("packed sequences need both spans and groups (ChunkTable.groups), "
                         f"got spans={spans is not None}, groups={groups is not None}")
    B, T, Hqk, _ = q.shape
    Hv, NT, NG = num_v_heads, num_chunks(T, spans), sb.shape[1]
    if dsb.shape != sb.shape:
        raise ValueError(f"group gradients {tuple(dsb.shape)} do not match the group states "
                         f"{tuple(sb.shape)}")
    dq, dkp, dw, dgam = dqk_buffers(q, Hv, cfg, cfg.stride_bwd_bk)
    programs = group_programs(NG * B * Hv, k.device, cfg)
    scratch = torch.empty(programs, 2, stride, D, D, device=k.device, dtype=w.dtype)
    _group_bwd_kernel[(programs,)](
        q_ptr=q, k_ptr=k, w_ptr=w, u_ptr=u, do_ptr=do, dvn_ptr=dvn, gamma_ptr=gamma, sb_ptr=sb, dsb_ptr=dsb,
        scr_ptr=scratch, dq_ptr=dq, dk_ptr=dkp, dw_ptr=dw, dgam_ptr=dgam,
        groups_ptr=groups if groups is not None else w, spans_ptr=spans if spans is not None else w,
        scale=scale, T=T, NT=NT, NG=NG, NBH=B * Hv, HQK=Hqk, HV=Hv, R=Hv // Hqk, DQ_HEADS=dq.shape[2],
        STRIDE=stride, VARLEN=spans is not None, BT=BT, D=D, BV=cfg.state_bv, BK=cfg.stride_bwd_bk,
        BVQ=cfg.stride_bwd_bv,
        num_warps=cfg.stride_bwd_warps, num_stages=cfg.stride_bwd_stages,
    )
    return dq, dkp, dw, dgam
