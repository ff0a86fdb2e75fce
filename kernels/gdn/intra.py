"""Stage 2: the intra-chunk solve. T = (I + A)⁻¹ from four exact 16×16 inverses and a block
merge, then Wk = T·(β e^γ K) and U = T·(β V)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import a_block, chunk_span, inv_unit_lower16, load_rows, mm
from kernels.gdn.config import BT, D, KernelConfig, dot_precision, kernel_config, num_chunks


@triton.jit
def _lower_block_product(x0, t10, x1, t20, t21, x2, t30, t31, t32, x3, y0, y1, y2, y3, PREC: tl.constexpr):
    """Rows I of T·Y for the 4×4 block lower-triangular T (16-row blocks): Σ_{J<=I} T_IJ·Y_J."""
    r0 = mm(x0, y0, PREC)
    r1 = mm(t10, y0, PREC) + mm(x1, y1, PREC)
    r2 = (
        mm(t20, y0, PREC)
        + mm(t21, y1, PREC)
        + mm(x2, y2, PREC)
    )
    r3 = (
        mm(t30, y0, PREC)
        + mm(t31, y1, PREC)
        + mm(t32, y2, PREC)
        + mm(x3, y3, PREC)
    )
    return r0, r1, r2, r3


@triton.jit
def _store_row_blocks(base, r0, r1, r2, r3, t0, t1, t2, t3, m0, m1, m2, m3, d, D: tl.constexpr):
    """Store four 16-row blocks of a [T, D] head-major tensor in its element type."""
    ty = base.dtype.element_ty
    tl.store(base + t0[:, None] * D + d[None, :], r0.to(ty), mask=m0[:, None])
    tl.store(base + t1[:, None] * D + d[None, :], r1.to(ty), mask=m1[:, None])
    tl.store(base + t2[:, None] * D + d[None, :], r2.to(ty), mask=m2[:, None])
    tl.store(base + t3[:, None] * D + d[None, :], r3.to(ty), mask=m3[:, None])


@triton.jit
def _intra_kernel(
    k_ptr, v_ptr, beta_ptr, gamma_ptr, w_ptr, u_ptr, tm_ptr, spans_ptr,
    T, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    STORE_U: tl.constexpr, STORE_T: tl.constexpr, PREC: tl.constexpr,
    VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr,
):
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    k_base = k_ptr + b * T * HQK * D + hk * D
    v_base = v_ptr + b * T * HV * D + h * D
    s = tl.arange(0, 16)
    d = tl.arange(0, D)
    r0, r1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
    last = tl.minimum(r0 + BT - 1, r1 - 1)
    g_last = tl.load(gamma_ptr + bh * T + last)

    # Four 16-row sub-blocks of the chunk.
    t0 = r0 + s
    t1 = t0 + 16
    t2 = t0 + 32
    t3 = t0 + 48
    m0, m1, m2, m3 = t0 < r1, t1 < r1, t2 < r1, t3 < r1
    k0 = load_rows(k_base, t0, m0, HQK * D, D)
    k1 = load_rows(k_base, t1, m1, HQK * D, D)
    k2 = load_rows(k_base, t2, m2, HQK * D, D)
    k3 = load_rows(k_base, t3, m3, HQK * D, D)
    b0 = tl.load(beta_ptr + (b * T + t0) * HV + h, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + (b * T + t1) * HV + h, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(beta_ptr + (b * T + t2) * HV + h, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(beta_ptr + (b * T + t3) * HV + h, mask=m3, other=0.0).to(tl.float32)
    g0 = tl.where(m0, tl.load(gamma_ptr + bh * T + t0, mask=m0, other=0.0), g_last)
    g1 = tl.where(m1, tl.load(gamma_ptr + bh * T + t1, mask=m1, other=0.0), g_last)
    g2 = tl.where(m2, tl.load(gamma_ptr + bh * T + t2, mask=m2, other=0.0), g_last)
    g3 = tl.where(m3, tl.load(gamma_ptr + bh * T + t3, mask=m3, other=0.0), g_last)

    # Diagonal inverses, then the block merge: T_IJ = −X_I·Σ_{J<=L<I} A_IL·T_LJ.
    x0 = inv_unit_lower16(a_block(k0, k0, b0, g0, g0, True))
    x1 = inv_unit_lower16(a_block(k1, k1, b1, g1, g1, True))
    x2 = inv_unit_lower16(a_block(k2, k2, b2, g2, g2, True))
    x3 = inv_unit_lower16(a_block(k3, k3, b3, g3, g3, True))
    a10 = a_block(k1, k0, b1, g1, g0, False)
    a20 = a_block(k2, k0, b2, g2, g0, False)
    a21 = a_block(k2, k1, b2, g2, g1, False)
    a30 = a_block(k3, k0, b3, g3, g0, False)
    a31 = a_block(k3, k1, b3, g3, g1, False)
    a32 = a_block(k3, k2, b3, g3, g2, False)
    t10 = -tl.dot(tl.dot(x1, a10, input_precision="ieee"), x0, input_precision="ieee")
    t21 = -tl.dot(tl.dot(x2, a21, input_precision="ieee"), x1, input_precision="ieee")
    t32 = -tl.dot(tl.dot(x3, a32, input_precision="ieee"), x2, input_precision="ieee")
    t20 = -tl.dot(
        x2, tl.dot(a20, x0, input_precision="ieee") + tl.dot(a21, t10, input_precision="ieee"),
        input_precision="ieee",
    )
    t31 = -tl.dot(
        x3, tl.dot(a31, x1, input_precision="ieee") + tl.dot(a32, t21, input_precision="ieee"),
        input_precision="ieee",
    )
    t30 = -tl.dot(
        x3,
        tl.dot(a30, x0, input_precision="ieee")
        + tl.dot(a31, t10, input_precision="ieee")
        + tl.dot(a32, t20, input_precision="ieee"),
        input_precision="ieee",
    )

    if STORE_T:
        # T as [B·Hv, T, 64] fp32 (row = token, column = position in its chunk); zeros above.
        tm_base = tm_ptr + bh * T * BT
        z = tl.zeros([16, 16], dtype=tl.float32)
        tl.store(tm_base + t0[:, None] * BT + s[None, :], x0, mask=m0[:, None])
        tl.store(tm_base + t0[:, None] * BT + 16 + s[None, :], z, mask=m0[:, None])
        tl.store(tm_base + t0[:, None] * BT + 32 + s[None, :], z, mask=m0[:, None])
        tl.store(tm_base + t0[:, None] * BT + 48 + s[None, :], z, mask=m0[:, None])
        tl.store(tm_base + t1[:, None] * BT + s[None, :], t10, mask=m1[:, None])
        tl.store(tm_base + t1[:, None] * BT + 16 + s[None, :], x1, mask=m1[:, None])
        tl.store(tm_base + t1[:, None] * BT + 32 + s[None, :], z, mask=m1[:, None])
        tl.store(tm_base + t1[:, None] * BT + 48 + s[None, :], z, mask=m1[:, None])
        tl.store(tm_base + t2[:, None] * BT + s[None, :], t20, mask=m2[:, None])
        tl.store(tm_base + t2[:, None] * BT + 16 + s[None, :], t21, mask=m2[:, None])
        tl.store(tm_base + t2[:, None] * BT + 32 + s[None, :], x2, mask=m2[:, None])
        tl.store(tm_base + t2[:, None] * BT + 48 + s[None, :], z, mask=m2[:, None])
        tl.store(tm_base + t3[:, None] * BT + s[None, :], t30, mask=m3[:, None])
        tl.store(tm_base + t3[:, None] * BT + 16 + s[None, :], t31, mask=m3[:, None])
        tl.store(tm_base + t3[:, None] * BT + 32 + s[None, :], t32, mask=m3[:, None])
        tl.store(tm_base + t3[:, None] * BT + 48 + s[None, :], x3, mask=m3[:, None])

    # Wk_I = Σ_J T_IJ·(β e^γ K)_J, in fp32 operands.
    w_base = w_ptr + bh * T * D
    xk0 = k0.to(tl.float32) * (b0 * tl.exp(g0))[:, None]
    xk1 = k1.to(tl.float32) * (b1 * tl.exp(g1))[:, None]
    xk2 = k2.to(tl.float32) * (b2 * tl.exp(g2))[:, None]
    xk3 = k3.to(tl.float32) * (b3 * tl.exp(g3))[:, None]
    w0, w1, w2, w3 = _lower_block_product(
        x0, t10, x1, t20, t21, x2, t30, t31, t32, x3, xk0, xk1, xk2, xk3, PREC
    )
    _store_row_blocks(w_base, w0, w1, w2, w3, t0, t1, t2, t3, m0, m1, m2, m3, d, D)

    if STORE_U:
        u_base = u_ptr + bh * T * D
        xv0 = load_rows(v_base, t0, m0, HV * D, D).to(tl.float32) * b0[:, None]
        xv1 = load_rows(v_base, t1, m1, HV * D, D).to(tl.float32) * b1[:, None]
        xv2 = load_rows(v_base, t2, m2, HV * D, D).to(tl.float32) * b2[:, None]
        xv3 = load_rows(v_base, t3, m3, HV * D, D).to(tl.float32) * b3[:, None]
        u0, u1, u2, u3 = _lower_block_product(
            x0, t10, x1, t20, t21, x2, t30, t31, t32, x3, xv0, xv1, xv2, xv3, PREC
        )
        _store_row_blocks(u_base, u0, u1, u2, u3, t0, t1, t2, t3, m0, m1, m2, m3, d, D)


def intra_solve(
    k: torch.Tensor,
    v: torch.Tensor | None,
    beta: torch.Tensor,
    gamma: torch.Tensor,
    num_v_heads: int,
    *,
    store_t: bool = False,
    spans: torch.Tensor | None = None,
    cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Wk [B·Hv, T, D] and U (None when v is None) in k's dtype, and T [B·Hv, T, 64] fp32 if asked.
    `spans`: the chunk table of packed sequences (`chunks.ChunkTable`); rows stay packed."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    B, T, Hqk, _ = k.shape
    Hv = num_v_heads
    w = torch.empty(B * Hv, T, D, device=k.device, dtype=k.dtype)
    u = torch.empty_like(w) if v is not None else None
    tm = torch.empty(B * Hv, T, BT, device=k.device, dtype=torch.float32) if store_t else None
    _intra_kernel[(num_chunks(T, spans), B * Hv)](
        k_ptr=k, v_ptr=v if v is not None else k, beta_ptr=beta, gamma_ptr=gamma, w_ptr=w,
        u_ptr=u if u is not None else w, tm_ptr=tm if tm is not None else w,
        spans_ptr=spans if spans is not None else w, T=T, HQK=Hqk, HV=Hv, R=Hv // Hqk,
        STORE_U=v is not None, STORE_T=tm is not None, PREC=dot_precision(cfg, k.dtype, "wu"),
        VARLEN=spans is not None, BT=BT, D=D, num_warps=cfg.intra_warps,
    )
    return w, u, tm
