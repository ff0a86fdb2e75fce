"""Backward stage 3: per chunk dq, the state/output part of dk, dWk and the γ-gradient partials."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_span, load_gamma, transpose_via
from kernels.gdn.config import BT, D, KernelConfig, kernel_config, num_chunks


# r is not specialised (Triton would compile r == 1 apart): one compile serves every head but the
# first and the last of a group.
@triton.jit(do_not_specialize=["r"])
def _bwd_dqk_kernel(
    q_ptr, k_ptr, vn_ptr, do_ptr, dvn_ptr, s_ptr, ds_ptr, gamma_ptr,
    dq_ptr, dk_ptr, dw_ptr, dgam_ptr, spans_ptr, scale,
    T, NT, r, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    CARRY_IN: tl.constexpr, CARRY_OUT: tl.constexpr,
    VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """Columns [ik·BK, (ik+1)·BK) of dq, dk, dWk for one chunk of value head hk·R + r of q/k head
    b·Hqk + hk (program_id 2), from the per-chunk S and dS' ([B·Hv, NT, D, D]). A group's heads
    run one launch each, r = 0 .. R − 1 in order (`dqk_chunk`: dq's running sum passes from
    launch to launch, so the sum has a fixed order and is bitwise reproducible)."""
    j = tl.program_id(0)
    ik = tl.program_id(1)
    bhk = tl.program_id(2).to(tl.int64)
    b, hk = bhk // HQK, bhk % HQK
    t0, t1 = chunk_span(j, T, spans_ptr, VARLEN, BT)
    bh = b * HV + hk * R + (r if R > 1 else 0)  # R == 1: no runtime head offset at all
    slot = (bh * NT + j) * D * D
    dqk_chunk(
        q_ptr, k_ptr, vn_ptr, do_ptr, dvn_ptr, s_ptr + slot, ds_ptr + slot,
        gamma_ptr, dq_ptr, dk_ptr, dw_ptr, dgam_ptr, scale, ik, bh, tl.num_programs(2) * R,
        t0, t1, T, HQK, HV, R, CARRY_IN, CARRY_OUT, BT, D, BK, BV,
    )


@triton.jit
def dqk_chunk(
    q_ptr, k_ptr, vn_ptr, do_ptr, dvn_ptr, s_base, ds_base, gamma_ptr,
    dq_ptr, dk_ptr, dw_ptr, dgam_ptr, scale, ik, bh, NBH, t0, t1, T,
    HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, CARRY_IN: tl.constexpr, CARRY_OUT: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """bwd_dqk's work for the chunk at rows t0 .. t1 of value head bh (of NBH), key columns
    [ik·BK, (ik+1)·BK): S and dS' are the chunk's [D, D] states at `s_base` and `ds_base` (row
    stride D). dq of a q/k head sums its
    value heads' terms, carried from one head's launch to the next through the next head's dk
    tile (fp32, written by nobody else before that head's launch overwrites it): CARRY_IN adds
    what the previous head left in this head's tile, CARRY_OUT leaves the sum in the next head's
    tile instead of storing dq. Every γ-gradient term is linear in the column split, so each key
    slice writes its own dγ partial (summed by the WY stage)."""
    b, h = bh // HV, bh % HV
    hk = h // R
    dkc = ik * BK + tl.arange(0, BK)
    i = tl.arange(0, BT)
    t = t0 + i
    m = t < t1
    qk_off = b * T * HQK * D + hk * D
    q = tl.load(q_ptr + qk_off + t[:, None] * (HQK * D) + dkc[None, :], mask=m[:, None], other=0.0)
    kc = tl.load(k_ptr + qk_off + t[:, None] * (HQK * D) + dkc[None, :], mask=m[:, None], other=0.0)
    dt = q.dtype
    gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
    dq_acc = tl.zeros([BT, BK], dtype=tl.float32)  # dO·Sᵀ
    dk_acc = tl.zeros([BT, BK], dtype=tl.float32)  # Vn·dS'ᵀ
    dw_acc = tl.zeros([BT, BK], dtype=tl.float32)  # dVn·Sᵀ
    dp = tl.zeros([BT, BT], dtype=tl.float32)  # dO·Vnᵀ
    sds = tl.zeros([BK], dtype=tl.float32)  # row sums of S ⊙ dS'
    for iv in range(D // BV):
        dv = iv * BV + tl.arange(0, BV)
        S = tl.load(s_base + dkc[:, None] * D + dv[None, :])  # [BK, BV]
        dS = tl.load(ds_base + dkc[:, None] * D + dv[None, :])
        vn = tl.load(vn_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        dvn = tl.load(dvn_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        do = tl.load(do_ptr + ((b * T + t[:, None]) * HV + h) * D + dv[None, :], mask=m[:, None], other=0.0)
        do = do.to(dt)
        dq_acc += tl.dot(do, tl.trans(S))
        dk_acc += tl.dot(vn, tl.trans(dS))
        dw_acc += tl.dot(dvn, tl.trans(S))
        dp += tl.dot(do, tl.trans(vn))
        sds += tl.sum(S.to(tl.float32) * dS.to(tl.float32), axis=1)
    causal = i[:, None] >= i[None, :]
    e = tl.where(causal, tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
    dpm = dp * e * scale
    qk = tl.dot(q, tl.trans(kc))  # this program's column share of Q·Kᵀ
    eg = tl.exp(gam)
    ekd = tl.exp(g_last - gam)
    dq = dq_acc * (scale * eg)[:, None] + tl.dot(dpm.to(dt), kc)
    dk_tile = dk_ptr + (bh * T + t[:, None]) * D + dkc[None, :]
    if CARRY_IN:
        dq += tl.load(dk_tile, mask=m[:, None], other=0.0)
        tl.debug_barrier()  # every warp has read the carry before the transpose overwrites it
    if CARRY_OUT:
        tl.store(dk_tile + T * D, dq, mask=m[:, None])
    else:
        dq_off = ((b * T + t[:, None]) * HQK + hk) * D + dkc[None, :]
        tl.store(dq_ptr + dq_off, dq.to(dq_ptr.dtype.element_ty), mask=m[:, None])
    # dpmᵀ through this program's own dk tile (BK >= BT columns; written with dk below)
    dpmt = transpose_via(dk_ptr + (bh * T + t0) * D + ik * BK, dpm, i, m, D)
    dk = dk_acc * ekd[:, None] + tl.dot(dpmt.to(dt), q)
    z = dpm * qk
    y = ekd * tl.sum(kc.to(tl.float32) * dk_acc, axis=1)
    dgam = scale * eg * tl.sum(dq_acc * q.to(tl.float32), axis=1) + tl.sum(z, axis=1) - tl.sum(z, axis=0) - y
    last = tl.minimum(t1 - 1 - t0, BT - 1)
    dgam += tl.where(i == last, tl.sum(tl.where(m, y, 0.0)) + tl.exp(g_last) * tl.sum(sds), 0.0)
    tl.store(dk_tile, dk, mask=m[:, None])
    dw_off = (bh * T + t[:, None]) * D + dkc[None, :]
    tl.store(dw_ptr + dw_off, (-dw_acc).to(dw_ptr.dtype.element_ty), mask=m[:, None])
    tl.store(dgam_ptr + (ik * NBH + bh) * T + t, dgam, mask=m)


def dqk_buffers(
    q: torch.Tensor, num_v_heads: int, cfg: KernelConfig, BK: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outputs of bwd_dqk's work (`dqk_chunk`) in key slices of BK columns, uninitialised: dq
    ([B, T, Hqk, D] in q's dtype, summed over each q/k head's value heads), the dk partial (fp32,
    per value head, head-major), dWk (q's dtype with cfg.dw_low, else fp32) and the dγ partials
    [D/BK, B·Hv, T]."""
    B, T, _, _ = q.shape
    if BK < BT or D % BK:
        raise ValueError(f"key slice of {BK} columns: bwd_dqk's work transposes a {BT}x{BT} tile in its "
                         f"dk columns, so it needs at least {BT} columns, and a divisor of {D}")
    dq = torch.empty_like(q)
    dkp = torch.empty(B * num_v_heads, T, D, device=q.device, dtype=torch.float32)
    low_dw = cfg.dw_low and q.dtype != torch.float32
    dw = torch.empty_like(dkp, dtype=q.dtype if low_dw else torch.float32)
    dgam = torch.empty(D // BK, B * num_v_heads, T, device=q.device, dtype=torch.float32)
    return dq, dkp, dw, dgam


def bwd_dqk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, gamma: torch.Tensor, s: torch.Tensor,
    ds: torch.Tensor, vn: torch.Tensor, dvn: torch.Tensor, do: torch.Tensor, scale: float,
    spans: torch.Tensor | None = None, *, cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq (final: [B, T, Hqk, D] in q's dtype), the state/output part of dk (fp32, per value
    head, head-major), dWk and the dγ partials [D/BK, B·Hv, T] (`dqk_buffers`); `spans` as in
    `intra_solve`. With grouped heads (Hv = R·Hqk) R launches, one per value head of every group
    (`_bwd_dqk_kernel`)."""
    cfg = cfg or kernel_config(q.dtype, q.device)
    B, T, Hqk, _ = q.shape
    Hv, NT = num_v_heads, num_chunks(T, spans)
    BK = cfg.dqk_bk
    dq, dkp, dw, dgam = dqk_buffers(q, Hv, cfg, BK)
    R = Hv // Hqk
    for r in range(R):
        _bwd_dqk_kernel[(NT, D // BK, B * Hqk)](
            q_ptr=q, k_ptr=k, vn_ptr=vn, do_ptr=do, dvn_ptr=dvn, s_ptr=s, ds_ptr=ds, gamma_ptr=gamma,
            dq_ptr=dq, dk_ptr=dkp, dw_ptr=dw, dgam_ptr=dgam,
            spans_ptr=spans if spans is not None else dq, scale=scale,
            T=T, NT=NT, r=r, HQK=Hqk, HV=Hv, R=R, CARRY_IN=r > 0, CARRY_OUT=r < R - 1,
            VARLEN=spans is not None, BT=BT, D=D, BK=BK, BV=cfg.dqk_bv,
            num_warps=cfg.dqk_warps,
        )
    return dq, dkp, dw, dgam
