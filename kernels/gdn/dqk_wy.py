"""Backward stages 3 and 4 fused: dq, dk, dv, dβ and dg of one chunk and head in one program.

`bwd_dqk` and `bwd_wy` are both one program per chunk and head at the bf16 settings (BK = D), and
the first hands the second dWk, the fp32 dk partial and the dγ partials through memory (at 64K and
B·Hv = 32: 1 GiB of fp32 partial written and read once, 512 MiB of dWk written once and read
twice). Here they stay in registers: the S/dS products build dq, the state/output part of dk
and dWk for all D columns, then the WY backward runs on full-width tiles. The two 64×64
transposes of dot results go through this program's rows of the dk output, which it writes last
(`transpose_via`, never `tl.trans` of a dot result into a dot).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_span, load_gamma, load_rows, mm, transpose_via
from kernels.gdn.config import BT, TUNING, D, dot_precision, num_chunks, tuned


@triton.jit
def _bwd_dqk_wy_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, gamma_ptr, tm_ptr, s_ptr, ds_ptr, vn_ptr, dvn_ptr, do_ptr,
    dq_ptr, dk_ptr, dv_ptr, dbeta_ptr, dg_ptr, spans_ptr, scale,
    T, NT, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, DQ_HEADS: tl.constexpr,
    DK_HEADS: tl.constexpr, DK_ROW_F32: tl.constexpr,
    PREC_DT: tl.constexpr, PREC_DA: tl.constexpr, PREC_DX: tl.constexpr,
    VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    d = tl.arange(0, D)
    i = tl.arange(0, BT)
    t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
    t = t0 + i
    m = t < t1
    qk_off = b * T * HQK * D + hk * D
    q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
    kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
    dt = q.dtype
    gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)

    # --- the state/output part (bwd_dqk with all D key columns in one program)
    dq_acc = tl.zeros([BT, D], dtype=tl.float32)  # dO·Sᵀ
    dk_acc = tl.zeros([BT, D], dtype=tl.float32)  # Vn·dS'ᵀ
    dw_acc = tl.zeros([BT, D], dtype=tl.float32)  # dVn·Sᵀ
    dp = tl.zeros([BT, BT], dtype=tl.float32)  # dO·Vnᵀ
    sds = tl.zeros([D], dtype=tl.float32)  # row sums of S ⊙ dS'
    s_base = s_ptr + (bh * NT + c) * D * D
    ds_base = ds_ptr + (bh * NT + c) * D * D
    for iv in range(D // BV):
        dv = iv * BV + tl.arange(0, BV)
        S = tl.load(s_base + d[:, None] * D + dv[None, :])  # [D, BV]
        dS = tl.load(ds_base + d[:, None] * D + dv[None, :])
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
    eg = tl.exp(gam)
    ekd = tl.exp(g_last - gam)
    dq = dq_acc * (scale * eg)[:, None] + tl.dot(dpm.to(dt), kc)
    if DQ_HEADS == HQK:
        dq_off = ((b * T + t[:, None]) * HQK + hk) * D + d[None, :]
    else:
        dq_off = ((b * T + t[:, None]) * HV + h) * D + d[None, :]
    tl.store(dq_ptr + dq_off, dq.to(dq_ptr.dtype.element_ty), mask=m[:, None])
    dgam = scale * eg * tl.sum(dq_acc * q.to(tl.float32), axis=1)  # dq_acc's last use
    y = ekd * tl.sum(kc.to(tl.float32) * dk_acc, axis=1)
    z = dpm * tl.dot(q, tl.trans(kc))
    dgam += tl.sum(z, axis=1) - tl.sum(z, axis=0) - y
    # This program's dk output rows, seen as fp32, carry both transposes (dk is written last).
    dk_rows = dk_ptr + ((b * T + t0) * DK_HEADS + h // (HV // DK_HEADS)) * D
    scratch = dk_rows.to(tl.pointer_type(tl.float32))
    dpmt = transpose_via(scratch, dpm, i, m, DK_ROW_F32)
    dkp = dk_acc * ekd[:, None] + tl.dot(dpmt.to(dt), q)
    last = tl.minimum(t1 - 1 - t0, BT - 1)
    dgam += tl.where(i == last, tl.sum(tl.where(m, y, 0.0)) + tl.exp(g_last) * tl.sum(sds), 0.0)
    dw = -dw_acc  # dWk, fp32, never stored

    # --- the WY part (bwd_wy on full-width tiles; dU = dVn), ordered so that few full-width
    # fp32 tiles are live at once (dWk and dU die as soon as Tᵀ has been applied to them).
    beta = tl.load(beta_ptr + (b * T + t) * HV + h, mask=m, other=0.0).to(tl.float32)
    bg = beta * eg
    tm = tl.load(tm_ptr + (bh * T + t[:, None]) * BT + i[None, :], mask=m[:, None], other=0.0)
    tmt = tl.trans(tm)
    v_base = v_ptr + b * T * HV * D + h * D
    vf = load_rows(v_base, t, m, HV * D, D).to(tl.float32)
    du = tl.load(dvn_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0).to(tl.float32)
    kf = kc.to(tl.float32)
    d_t = mm(dw, tl.trans(kf * bg[:, None]), PREC_DT) + mm(du, tl.trans(vf * beta[:, None]), PREC_DT)
    dxk = mm(tmt, dw, PREC_DX)
    xk = tl.sum(dxk * kf, axis=1)
    dkp += dxk * bg[:, None]
    dxv = mm(tmt, du, PREC_DX)
    dbeta = xk * eg + tl.sum(dxv * vf, axis=1)
    dgam += xk * bg
    tl.store(dv_ptr + ((b * T + t[:, None]) * HV + h) * D + d[None, :],
             (dxv * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=m[:, None])  # fmt: skip
    kk = tl.dot(kc, tl.trans(kc))
    strict = (i[:, None] > i[None, :]) & m[:, None] & m[None, :]
    da = -mm(mm(tmt, d_t, PREC_DA), tmt, PREC_DA)
    ea = tl.exp(tl.where(strict, gam[:, None] - gam[None, :], 0.0))
    dae = tl.where(strict, da * ea, 0.0)
    dbeta += tl.sum(dae * kk, axis=1)
    z = dae * kk * beta[:, None]
    dgam += tl.sum(z, axis=1) - tl.sum(z, axis=0)
    bd = dae * beta[:, None]
    bdt = transpose_via(scratch, bd, i, m, DK_ROW_F32)
    dkp += mm(bd, kf, PREC_DX) + mm(bdt, kf, PREC_DX)
    if DK_HEADS == HQK:
        dk_off = ((b * T + t[:, None]) * HQK + hk) * D + d[None, :]
    else:
        dk_off = ((b * T + t[:, None]) * HV + h) * D + d[None, :]
    tl.store(dk_ptr + dk_off, dkp.to(dk_ptr.dtype.element_ty), mask=m[:, None])
    dgam = tl.where(m, dgam, 0.0)
    dg = tl.cumsum(dgam, axis=0, reverse=True)
    tl.store(dbeta_ptr + (b * T + t) * HV + h, dbeta.to(dbeta_ptr.dtype.element_ty), mask=m)
    tl.store(dg_ptr + (b * T + t) * HV + h, dg.to(dg_ptr.dtype.element_ty), mask=m)


def bwd_dqk_wy(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g_dtype: torch.dtype,
    gamma: torch.Tensor, tm: torch.Tensor, s: torch.Tensor, ds: torch.Tensor, vn: torch.Tensor,
    dvn: torch.Tensor, do: torch.Tensor, scale: float, spans: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """dq, dk (per value head fp32 when Hv > Hqk, as `bwd_dqk` / `bwd_wy` give them), dv, dβ, dg;
    `spans` as in `intra_solve`."""
    B, T, Hqk, _ = q.shape
    Hv, NT = v.shape[2], num_chunks(T, spans)
    R = Hv // Hqk
    heads = Hqk if R == 1 else Hv
    part = q.dtype if R == 1 else torch.float32
    dq = torch.empty(B, T, heads, D, device=q.device, dtype=part)
    dk = torch.empty(B, T, heads, D, device=q.device, dtype=part)
    dv = torch.empty_like(v)
    dbeta = torch.empty_like(beta)
    dg = torch.empty(B, T, Hv, device=q.device, dtype=g_dtype)
    _bwd_dqk_wy_kernel[(NT, B * Hv)](
        q, k, v, beta, gamma, tm, s, ds, vn, dvn, do, dq, dk, dv, dbeta, dg,
        spans if spans is not None else dg, scale,
        T, NT, Hqk, Hv, R, heads, heads, dk.stride(1) * dk.element_size() // 4, VARLEN=spans is not None,
        PREC_DT=dot_precision(k.dtype, "wy_dt"), PREC_DA=dot_precision(k.dtype, "wy_da"),
        PREC_DX=dot_precision(k.dtype, "wy_dx"), BT=BT, D=D, BV=tuned("dqkwy_bv", q.dtype),
        num_warps=tuned("dqkwy_warps", q.dtype), num_stages=TUNING["dqkwy_stages"],
    )  # fmt: skip
    return dq, dk, dv, dbeta, dg
