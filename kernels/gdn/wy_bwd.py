"""Backward stage 4: through the WY representation (T, Wk, U) to dk, dv, dβ, dγ, then dg."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_beta, chunk_span, load_gamma, mm, transpose_via
from kernels.gdn.config import BT, D, KernelConfig, dot_precision, kernel_config, num_chunks


# r is not specialised (Triton would compile r == 1 apart): one compile serves every head but the
# last of a group.
@triton.jit(do_not_specialize=["r"])
def _bwd_wy_kernel(
    k_ptr, v_ptr, beta_ptr, gamma_ptr, tm_ptr, dw_ptr, du_ptr, dkp_ptr, dgam_ptr,
    dk_ptr, dv_ptr, dbeta_ptr, dg_ptr, spans_ptr,
    T, NT, r, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, CARRY_OUT: tl.constexpr,
    SLOT: tl.constexpr,
    DK_ROW_F32: tl.constexpr, PREC_DT: tl.constexpr, PREC_DA: tl.constexpr, PREC_DX: tl.constexpr,
    VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, NK: tl.constexpr,
):
    """Chunk c of value head hk·R + r of q/k head b·Hqk + hk (program_id 1). Two passes over D
    slices keep only 64×BD tiles live: the first builds dT and K·Kᵀ (sums over D), the second
    applies Tᵀ and writes dk, dv slice by slice. The dk partial is bwd_dqk's, in chunk slots of
    SLOT fp32 elements (`dqk.dqk_buffers`). A group's heads run one launch each, r = 0 .. R − 1 in
    order; dk sums them: CARRY_OUT adds this head's dk into the next head's partial (read by
    nobody before that head's launch), the last head stores the sum in k's dtype (a fixed order:
    bitwise reproducible)."""
    c = tl.program_id(0)
    bhk = tl.program_id(1).to(tl.int64)
    b, hk = bhk // HQK, bhk % HQK
    h = hk * R + (r if R > 1 else 0)  # R == 1: no runtime head offset at all
    bh = b * HV + h
    i = tl.arange(0, BT)
    t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
    t = t0 + i
    m = t < t1
    k_base = k_ptr + b * T * HQK * D + hk * D
    v_base = v_ptr + b * T * HV * D + h * D
    beta = chunk_beta(beta_ptr, b, h, t, m, T, HV)
    gam, _, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
    eg = tl.exp(gam)
    bg = beta * eg
    tm = tl.load(tm_ptr + (bh * T + t[:, None]) * BT + i[None, :], mask=m[:, None], other=0.0).to(tl.float32)
    tmt = tl.trans(tm)
    d_t = tl.zeros([BT, BT], dtype=tl.float32)
    kk = tl.zeros([BT, BT], dtype=tl.float32)
    for s0 in range(0, D, BD):
        d = s0 + tl.arange(0, BD)
        ks = tl.load(k_base + t[:, None] * (HQK * D) + d[None, :], mask=m[:, None], other=0.0)
        vs = tl.load(v_base + t[:, None] * (HV * D) + d[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        dws = tl.load(dw_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0)
        dws = dws.to(tl.float32)
        dus = tl.load(du_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0)
        xk = ks.to(tl.float32) * bg[:, None]
        d_t += mm(dws, tl.trans(xk), PREC_DT)
        d_t += mm(dus.to(tl.float32), tl.trans(vs * beta[:, None]), PREC_DT)
        kk += tl.dot(ks, tl.trans(ks))
    # dA = −Tᵀ·dT·Tᵀ on the strict lower triangle; A_ij = β_i (k_i·k_j) e^{γ_i−γ_j}.
    strict = (i[:, None] > i[None, :]) & m[:, None] & m[None, :]
    da = -mm(mm(tmt, d_t, PREC_DA), tmt, PREC_DA)
    e = tl.exp(tl.where(strict, gam[:, None] - gam[None, :], 0.0))
    dae = tl.where(strict, da * e, 0.0)
    dbeta = tl.sum(dae * kk, axis=1)
    z = dae * kk * beta[:, None]
    dgam = tl.sum(z, axis=1) - tl.sum(z, axis=0)
    for ik in tl.static_range(NK):
        dgam += tl.load(dgam_ptr + (ik * tl.num_programs(1) * R + bh) * T + t, mask=m, other=0.0)
    bd = dae * beta[:, None]
    # bdᵀ through this program's dk output rows seen as fp32 (written as dk only by the group's
    # last head, in its second pass)
    dk_rows = dk_ptr + ((b * T + t0) * HQK + hk) * D
    bdt = transpose_via(dk_rows.to(tl.pointer_type(tl.float32)), bd, i, m, DK_ROW_F32)
    bdl = bd + bdt  # strictly lower plus strictly upper: one product with K, no cancellation
    for s0 in range(0, D, BD):
        d = s0 + tl.arange(0, BD)
        ks = tl.load(k_base + t[:, None] * (HQK * D) + d[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        vs = tl.load(v_base + t[:, None] * (HV * D) + d[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        dws = tl.load(dw_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0)
        dws = dws.to(tl.float32)
        dus = tl.load(du_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0)
        dxk = mm(tmt, dws, PREC_DX)
        dxv = mm(tmt, dus.to(tl.float32), PREC_DX)
        dkp_rows = dkp_ptr + (bh * NT + c) * SLOT + i[:, None] * D + d[None, :]
        dks = tl.load(dkp_rows, mask=m[:, None], other=0.0)
        dks += dxk * bg[:, None]
        dks += mm(bdl, ks, PREC_DX)
        dbeta += tl.sum(dxk * ks, axis=1) * eg + tl.sum(dxv * vs, axis=1)
        dgam += tl.sum(dxk * ks, axis=1) * bg
        if CARRY_OUT:
            nxt = dkp_rows + NT * SLOT
            tl.store(nxt, tl.load(nxt, mask=m[:, None], other=0.0) + dks, mask=m[:, None])
        else:
            tl.store(dk_ptr + ((b * T + t[:, None]) * HQK + hk) * D + d[None, :],
                     dks.to(dk_ptr.dtype.element_ty), mask=m[:, None])
        tl.store(dv_ptr + ((b * T + t[:, None]) * HV + h) * D + d[None, :],
                 (dxv * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=m[:, None])
    dgam = tl.where(m, dgam, 0.0)
    dg = tl.cumsum(dgam, axis=0, reverse=True)
    tl.store(dbeta_ptr + (b * T + t) * HV + h, dbeta.to(dbeta_ptr.dtype.element_ty), mask=m)
    tl.store(dg_ptr + (b * T + t) * HV + h, dg.to(dg_ptr.dtype.element_ty), mask=m)


def bwd_wy(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g_dtype: torch.dtype, gamma: torch.Tensor,
    tm: torch.Tensor, dw: torch.Tensor, dvn: torch.Tensor, dkp: torch.Tensor, dgam: torch.Tensor,
    spans: torch.Tensor | None = None, *, cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dk ([B, T, Hqk, D] in k's dtype, summed over each q/k head's value heads), dv, dβ and dg
    through the WY representation; `spans` as in `intra_solve`. With grouped heads (Hv = R·Hqk)
    R launches, one per value head of every group, which carry dk's running sum through the
    next head's rows of `dkp` (bwd_dqk's dk partial, fp32 in chunk slots [B·Hv, NT, SLOT]): `dkp`
    is overwritten."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    B, T, Hqk, _ = k.shape
    Hv, NT = v.shape[2], num_chunks(T, spans)
    R = Hv // Hqk
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dbeta = torch.empty_like(beta)
    dg = torch.empty(B, T, Hv, device=k.device, dtype=g_dtype)
    for r in range(R):
        _bwd_wy_kernel[(NT, B * Hqk)](
            k_ptr=k, v_ptr=v, beta_ptr=beta, gamma_ptr=gamma, tm_ptr=tm, dw_ptr=dw, du_ptr=dvn,
            dkp_ptr=dkp, dgam_ptr=dgam, dk_ptr=dk, dv_ptr=dv, dbeta_ptr=dbeta, dg_ptr=dg,
            spans_ptr=spans if spans is not None else dg,
            T=T, NT=NT, r=r, HQK=Hqk, HV=Hv, R=R, CARRY_OUT=r < R - 1, SLOT=dkp.stride(1),
            DK_ROW_F32=dk.stride(1) * dk.element_size() // 4,
            PREC_DT=dot_precision(cfg, k.dtype, "wy_dt"), PREC_DA=dot_precision(cfg, k.dtype, "wy_da"),
            PREC_DX=dot_precision(cfg, k.dtype, "wy_dx"), VARLEN=spans is not None, BT=BT, D=D,
            BD=cfg.wy_bd, NK=dgam.shape[0], num_warps=cfg.wy_warps, num_stages=cfg.wy_stages,
        )
    return dk, dv, dbeta, dg
