"""Stage 2: the intra-chunk solve, in two kernels. `_intra_t_kernel` forms T = (I + A)⁻¹ per
chunk from four 16×16 inverses by substitution and a block merge, at few warps (its work is
small tiles in a serial chain: one warp keeps it in registers, without barriers between warps);
`_intra_wu_kernel` then forms Wk = T·(β e^γ K) and U = T·(β V) with 64-row products, a
memory-bound pass at more warps."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_beta, chunk_span, chunk_t, chunk_vn, inv_unit_lower16, mm, value_rows
from kernels.gdn.config import BT, D, KernelConfig, dot_precision, kernel_config, num_chunks, t_dtype

# Columns per Wk/U product inside a program (H200 32K, intra_wu_bd 128: the intra stage 0.720 ms
# at 64 columns, 0.847 at 32).
WU_PRODUCT_COLS = 64


@triton.jit
def _kk_blocks(k_base, t0, t1, t2, t3, m0, m1, m2, m3,
               HQK: tl.constexpr, D: tl.constexpr, BK: tl.constexpr):
    """The ten lower 16×16 blocks K_I·K_Jᵀ (I >= J) of a chunk's K·Kᵀ, summed over key slices of
    BK columns (bf16/fp16 products, fp32 sums)."""
    z = tl.zeros([16, 16], dtype=tl.float32)
    a00, a11, a22, a33 = z, z, z, z
    a10, a20, a21, a30, a31, a32 = z, z, z, z, z, z
    for j in tl.static_range(0, D, BK):
        cols = j + tl.arange(0, BK)
        k0 = tl.load(k_base + t0[:, None] * HQK * D + cols[None, :], mask=m0[:, None], other=0.0)
        k1 = tl.load(k_base + t1[:, None] * HQK * D + cols[None, :], mask=m1[:, None], other=0.0)
        k2 = tl.load(k_base + t2[:, None] * HQK * D + cols[None, :], mask=m2[:, None], other=0.0)
        k3 = tl.load(k_base + t3[:, None] * HQK * D + cols[None, :], mask=m3[:, None], other=0.0)
        a00 = tl.dot(k0, tl.trans(k0), a00)
        a11 = tl.dot(k1, tl.trans(k1), a11)
        a22 = tl.dot(k2, tl.trans(k2), a22)
        a33 = tl.dot(k3, tl.trans(k3), a33)
        a10 = tl.dot(k1, tl.trans(k0), a10)
        a20 = tl.dot(k2, tl.trans(k0), a20)
        a21 = tl.dot(k2, tl.trans(k1), a21)
        a30 = tl.dot(k3, tl.trans(k0), a30)
        a31 = tl.dot(k3, tl.trans(k1), a31)
        a32 = tl.dot(k3, tl.trans(k2), a32)
    return a00, a11, a22, a33, a10, a20, a21, a30, a31, a32


@triton.jit
def _gated(kk, bi, gi, gj, DIAG: tl.constexpr):
    """A block from its K_I·K_Jᵀ: β_i·(k_i·k_j)·e^{γ_i−γ_j}, strictly lower when DIAG."""
    diff = gi[:, None] - gj[None, :]
    if DIAG:
        r = tl.arange(0, 16)
        low = r[:, None] > r[None, :]
        return tl.where(low, bi[:, None] * kk * tl.exp(tl.where(low, diff, 0.0)), 0.0)
    else:
        return bi[:, None] * kk * tl.exp(diff)


@triton.jit
def _store_row(tm_base, ti, mi, c0, c1, c2, c3, BT: tl.constexpr):
    """Row block ti of T [·, 64]: its four 16×16 blocks, columns 0, 16, 32, 48."""
    s = tl.arange(0, 16)
    ty = tm_base.dtype.element_ty
    tl.store(tm_base + ti[:, None] * BT + s[None, :], c0.to(ty), mask=mi[:, None])
    tl.store(tm_base + ti[:, None] * BT + 16 + s[None, :], c1.to(ty), mask=mi[:, None])
    tl.store(tm_base + ti[:, None] * BT + 32 + s[None, :], c2.to(ty), mask=mi[:, None])
    tl.store(tm_base + ti[:, None] * BT + 48 + s[None, :], c3.to(ty), mask=mi[:, None])


@triton.jit
def _intra_t_kernel(
    k_ptr, beta_ptr, gamma_ptr, tm_ptr, spans_ptr,
    T, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr, PREC_I: tl.constexpr,
    VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BK: tl.constexpr,
):
    """T of one chunk into tm [B·Hv, T, 64] in `t_dtype` (row = token, column = position in its
    chunk; zeros above the diagonal blocks)."""
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    k_base = k_ptr + b * T * HQK * D + hk * D
    s = tl.arange(0, 16)
    r0, r1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
    last = tl.minimum(r0 + BT - 1, r1 - 1)
    g_last = tl.load(gamma_ptr + bh * T + last)
    t0 = r0 + s
    t1 = t0 + 16
    t2 = t0 + 32
    t3 = t0 + 48
    m0, m1, m2, m3 = t0 < r1, t1 < r1, t2 < r1, t3 < r1
    b0 = tl.load(beta_ptr + (b * T + t0) * HV + h, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + (b * T + t1) * HV + h, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(beta_ptr + (b * T + t2) * HV + h, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(beta_ptr + (b * T + t3) * HV + h, mask=m3, other=0.0).to(tl.float32)
    g0 = tl.where(m0, tl.load(gamma_ptr + bh * T + t0, mask=m0, other=0.0), g_last)
    g1 = tl.where(m1, tl.load(gamma_ptr + bh * T + t1, mask=m1, other=0.0), g_last)
    g2 = tl.where(m2, tl.load(gamma_ptr + bh * T + t2, mask=m2, other=0.0), g_last)
    g3 = tl.where(m3, tl.load(gamma_ptr + bh * T + t3, mask=m3, other=0.0), g_last)

    kk00, kk11, kk22, kk33, kk10, kk20, kk21, kk30, kk31, kk32 = _kk_blocks(
        k_base, t0, t1, t2, t3, m0, m1, m2, m3, HQK, D, BK
    )
    # Diagonal inverses, then the block merge: T_IJ = −X_I·Σ_{J<=L<I} A_IL·T_LJ.
    x0 = inv_unit_lower16(_gated(kk00, b0, g0, g0, True), PREC_I)
    x1 = inv_unit_lower16(_gated(kk11, b1, g1, g1, True), PREC_I)
    x2 = inv_unit_lower16(_gated(kk22, b2, g2, g2, True), PREC_I)
    x3 = inv_unit_lower16(_gated(kk33, b3, g3, g3, True), PREC_I)
    a10 = _gated(kk10, b1, g1, g0, False)
    a20 = _gated(kk20, b2, g2, g0, False)
    a21 = _gated(kk21, b2, g2, g1, False)
    a30 = _gated(kk30, b3, g3, g0, False)
    a31 = _gated(kk31, b3, g3, g1, False)
    a32 = _gated(kk32, b3, g3, g2, False)
    t10 = -mm(mm(x1, a10, PREC), x0, PREC)
    t21 = -mm(mm(x2, a21, PREC), x1, PREC)
    t32 = -mm(mm(x3, a32, PREC), x2, PREC)
    t20 = -mm(x2, mm(a20, x0, PREC) + mm(a21, t10, PREC), PREC)
    t31 = -mm(x3, mm(a31, x1, PREC) + mm(a32, t21, PREC), PREC)
    t30 = -mm(x3, mm(a30, x0, PREC) + mm(a31, t10, PREC) + mm(a32, t20, PREC), PREC)

    tm_base = tm_ptr + bh * T * BT
    z = tl.zeros([16, 16], dtype=tl.float32)
    _store_row(tm_base, t0, m0, x0, z, z, z, BT)
    _store_row(tm_base, t1, m1, t10, x1, z, z, BT)
    _store_row(tm_base, t2, m2, t20, t21, x2, z, BT)
    _store_row(tm_base, t3, m3, t30, t31, t32, x3, BT)


@triton.jit
def u_cols(tmat, bt, v_ptr, b, h, t, m, dcol, T, HV: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr):
    """Columns dcol of U = (T·diag(β))·V for the chunk at rows t, fp32: T·diag(β) at PREC (the
    wu group: "low" rounds it to the input dtype) times the exact V tile. The intra stage stores
    it; a forward walk forms it in its step instead under `KernelConfig.walk_vn` "u"."""
    vt = value_rows(v_ptr, b, h, t, m, dcol, T, HV, D)
    return mm(tmat * bt[None, :], vt.to(tl.float32), PREC)


@triton.jit
def t_wk(tmat, bt, gam):
    """T·diag(βe^γ), fp32: Wk = T·diag(βe^γ)·K at the wu precision, where the intra stage writes
    Wk and where a reverse walk forms it (`KernelConfig.walk_wk`). Scaling T's 64 columns costs
    less than scaling the [64, D] K tile."""
    return tmat * (bt * tl.exp(gam))[None, :]


@triton.jit
def wk_vn(S, w_ptr, u_ptr, v_ptr, beta_ptr, tm_ptr, bh, b, h, t, m, dv, T, HV: tl.constexpr,
          VN_FROM: tl.constexpr, WITH_V: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr,
          D: tl.constexpr):
    """Vn = U − Wk·S for value columns dv (fp32), Wk read: U read ("load") or formed here from T,
    β and V ("u": `u_cols` at PREC; it does not depend on S); without WITH_V, U = 0."""
    dk = tl.arange(0, D)
    wk = tl.load(w_ptr + (bh * T + t[:, None]) * D + dk[None, :], mask=m[:, None], other=0.0)
    ws = tl.dot(wk, S.to(wk.dtype))
    if WITH_V:
        if VN_FROM == "u":
            u = u_cols(chunk_t(tm_ptr, bh, t, m, T, BT), chunk_beta(beta_ptr, b, h, t, m, T, HV), v_ptr, b, h,
                       t, m, dv, T, HV, D, PREC)
        else:
            u = tl.load(u_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        vn = u - ws
    else:
        vn = -ws
    return vn


@triton.jit
def walk_vn(S, kc, gam, w_ptr, u_ptr, v_ptr, beta_ptr, tm_ptr, bh, b, h, t, m, dv, T, HV: tl.constexpr,
            VN_FROM: tl.constexpr, WITH_V: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr,
            D: tl.constexpr):
    """A forward walk's Vn for value columns dv (fp32), from the state S entering the chunk, as
    `KernelConfig.walk_vn` says: "load" and "u" through Wk (`wk_vn`); "t": T·(β⊙V − βe^γ⊙(K·S))
    at PREC (`common.chunk_vn`) from the chunk's K (kc) and γ, neither Wk nor U read. Without
    WITH_V, V = 0."""
    if VN_FROM == "t":
        bt = chunk_beta(beta_ptr, b, h, t, m, T, HV)
        if WITH_V:
            v = value_rows(v_ptr, b, h, t, m, dv, T, HV, D)
        else:
            v = (bt * 0.0)[:, None]  # X = −βe^γ⊙(K·S), broadcast over dv
        vn, _ = chunk_vn(chunk_t(tm_ptr, bh, t, m, T, BT), kc, v, bt, gam, S.to(kc.dtype), PREC)
    else:
        vn = wk_vn(S, w_ptr, u_ptr, v_ptr, beta_ptr, tm_ptr, bh, b, h, t, m, dv, T, HV, VN_FROM, WITH_V,
                   PREC, BT, D)
    return vn


@triton.jit
def _intra_wu_kernel(
    k_ptr, v_ptr, beta_ptr, gamma_ptr, tm_ptr, w_ptr, u_ptr, spans_ptr,
    T, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, STORE_U: tl.constexpr,
    PREC: tl.constexpr, VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
    BS: tl.constexpr,
):
    """Columns [BD·j, BD·j + BD) of Wk = (T·diag(β e^γ))·K and U = (T·diag(β))·V for one chunk, in
    products of BS columns: T is read once per program, and the factors scale T's 64 columns
    rather than the [64, BS] K and V tiles."""
    c = tl.program_id(0)
    d0 = tl.program_id(1) * BD
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    r0, r1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
    last = tl.minimum(r0 + BT - 1, r1 - 1)
    t = r0 + tl.arange(0, BT)
    m = t < r1
    tmat = chunk_t(tm_ptr, bh, t, m, T, BT)
    bt = chunk_beta(beta_ptr, b, h, t, m, T, HV)
    g_last = tl.load(gamma_ptr + bh * T + last)
    gt = tl.where(m, tl.load(gamma_ptr + bh * T + t, mask=m, other=0.0), g_last)
    tw = t_wk(tmat, bt, gt)
    k_rows = (b * T + t[:, None]) * HQK * D + hk * D
    for s0 in tl.static_range(0, BD, BS):
        dcol = d0 + s0 + tl.arange(0, BS)
        out = (bh * T + t[:, None]) * D + dcol[None, :]
        kt = tl.load(k_ptr + k_rows + dcol[None, :], mask=m[:, None], other=0.0)
        tl.store(w_ptr + out, mm(tw, kt.to(tl.float32), PREC).to(w_ptr.dtype.element_ty), mask=m[:, None])
        if STORE_U:
            u = u_cols(tmat, bt, v_ptr, b, h, t, m, dcol, T, HV, D, PREC)
            tl.store(u_ptr + out, u.to(u_ptr.dtype.element_ty), mask=m[:, None])


VnFrom = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (v, beta, T): what a walk forms U or Vn from


def walk_vn_operands(
    w: torch.Tensor | None, u: torch.Tensor | None, vn_from: VnFrom | None, fill: torch.Tensor,
    cfg: KernelConfig,
) -> dict[str, object]:
    """The Vn arguments of a forward walk kernel (`walk_vn`): Wk and U read (`vn_from` None; u None:
    V = 0), U formed in the step from `vn_from` = (v, beta, T) with Wk read (w given), or Vn formed
    from `vn_from` with no Wk (w None). `fill` stands in for the pointers not read."""
    if vn_from is None:
        if w is None:
            raise ValueError("a walk without vn_from = (v, beta, T) reads Wk: w is required")
        v, beta, tm = fill, fill, fill
        mode, prec = "load", dot_precision(cfg, fill.dtype, "wu")
    else:
        if u is not None:
            raise ValueError("a walk reads U from u or forms it from vn_from = (v, beta, T), not both")
        v, beta, tm = vn_from
        mode = "u" if w is not None else "t"
        prec = dot_precision(cfg, fill.dtype, "wu" if w is not None else "vn")
    return dict(w_ptr=fill if w is None else w, u_ptr=fill if u is None else u, v_ptr=v, beta_ptr=beta,
                tm_ptr=tm, VN_FROM=mode, WITH_V=u is not None or vn_from is not None, PREC=prec)


def intra_t(
    k: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor, num_v_heads: int, *,
    spans: torch.Tensor | None = None, cfg: KernelConfig | None = None,
) -> torch.Tensor:
    """T [B·Hv, T, 64] in `t_dtype` (`_intra_t_kernel`): all the fused path keeps of the solve, since
    it forms Vn from T on chip. `spans` as in `intra_solve`."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    B, T, Hqk, _ = k.shape
    Hv = num_v_heads
    tm = torch.empty(B * Hv, T, BT, device=k.device, dtype=t_dtype(cfg, k.dtype))
    _intra_t_kernel[(num_chunks(T, spans), B * Hv)](
        k_ptr=k, beta_ptr=beta, gamma_ptr=gamma, tm_ptr=tm, spans_ptr=spans if spans is not None else tm,
        T=T, HQK=Hqk, HV=Hv, R=Hv // Hqk, PREC=dot_precision(cfg, k.dtype, "tm"),
        PREC_I=dot_precision(cfg, k.dtype, "inv"), VARLEN=spans is not None, BT=BT, D=D, BK=cfg.intra_bk,
        num_warps=cfg.intra_warps,
    )
    return tm


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
    """Wk [B·Hv, T, D] and U (None when v is None) in k's dtype, and T [B·Hv, T, 64] in
    `t_dtype` if asked (always formed: the second kernel reads it). `spans`: the chunk table of
    packed sequences (`chunks.ChunkTable`); rows stay packed."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    tm = intra_t(k, beta, gamma, num_v_heads, spans=spans, cfg=cfg)
    w, u = intra_wu(k, v, beta, gamma, tm, spans=spans, cfg=cfg)
    return w, u, tm if store_t else None


def intra_wu(
    k: torch.Tensor, v: torch.Tensor | None, beta: torch.Tensor, gamma: torch.Tensor, tm: torch.Tensor, *,
    spans: torch.Tensor | None = None, cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Wk and U (None when v is None) from T (`intra_t`), [B·Hv, T, D] in k's dtype; also the
    backward's Wk when the forward formed Vn from T (`KernelConfig.walk_vn` "t")."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    B, T, Hqk, _ = k.shape
    Hv = tm.shape[0] // B
    if D % cfg.intra_wu_bd or cfg.intra_wu_bd % 16:
        raise ValueError(f"intra_wu_bd = {cfg.intra_wu_bd}: expected a multiple of 16 that divides D = {D}")
    w = torch.empty(B * Hv, T, D, device=k.device, dtype=k.dtype)
    u = torch.empty_like(w) if v is not None else None
    table = spans if spans is not None else w
    _intra_wu_kernel[(num_chunks(T, spans), D // cfg.intra_wu_bd, B * Hv)](
        k_ptr=k, v_ptr=v if v is not None else k, beta_ptr=beta, gamma_ptr=gamma, tm_ptr=tm, w_ptr=w,
        u_ptr=u if u is not None else w, spans_ptr=table, T=T, HQK=Hqk, HV=Hv, R=Hv // Hqk,
        STORE_U=v is not None, PREC=dot_precision(cfg, k.dtype, "wu"), VARLEN=spans is not None,
        BT=BT, D=D, BD=cfg.intra_wu_bd, BS=min(cfg.intra_wu_bd, WU_PRODUCT_COLS),
        num_warps=cfg.intra_wu_warps,
    )
    return w, u
