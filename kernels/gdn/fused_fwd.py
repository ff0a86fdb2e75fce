"""The fused forward: one program walks a segment of a head (a slice of `fused_bv` value columns of
its state, 128 = all of it) and forms each chunk's Vn = T·(β⊙V − βe^γ⊙(K·S)) and output on chip,
so Wk, U, per-chunk S and Vn never reach memory. It writes o, the final state and, for the
backward, the fp32 state entering every group of `fused_group` chunks; T comes from the intra
solve's first kernel (`intra.intra_t`).

Below the multiprocessor count the sequence is cut into segments (`fused_segments`), joined
exactly: every segment's affine map S_out = M·S_in + E from a zero start, walked with the same
on-chip Vn over separable value columns (`_fused_maps_kernel`), then the scan of
`segments.segment_scan` gives each segment its true entering state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import (
    chunk_beta,
    chunk_t,
    chunk_vn,
    load_gamma,
    load_rows,
    mm,
    state_next,
    value_rows,
)
from kernels.gdn.config import BT, D, KernelConfig, dot_precision, fused_bwd_parts, num_chunks
from kernels.gdn.segments import segment_scan


@triton.jit
def chunk_inputs(k_ptr, beta_ptr, gamma_ptr, tm_ptr, b, bh, hk, t0, T, HQK: tl.constexpr, HV: tl.constexpr,
                 BT: tl.constexpr, D: tl.constexpr):
    """What every walk reads of one chunk (rows t0 .. t0 + BT, masked at T): K [BT, D], β, γ with
    γ_last, T [BT, BT] in fp32, the rows and their mask."""
    i = tl.arange(0, BT)
    t = t0 + i
    m = t < T
    kc = load_rows(k_ptr + b * T * HQK * D + hk * D, t, m, HQK * D, D)
    bt = chunk_beta(beta_ptr, b, bh % HV, t, m, T, HV)
    gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, T, T, BT)
    return kc, bt, gam, g_last, chunk_t(tm_ptr, bh, t, m, T, BT), t, m


@triton.jit
def _fused_fwd_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, gamma_ptr, tm_ptr, s0_ptr, o_ptr, ht_ptr, sg_ptr, scale,
    T, NT, NG, CPS, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, HAS_S0: tl.constexpr,
    STORE_HT: tl.constexpr, STORE_GROUPS: tl.constexpr, PREC: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr, KG: tl.constexpr,
):
    """Value columns dv of head bh (program_id 1) over segment seg (program_id 2) of CPS chunks,
    from its entering state s0[bh, seg] (h0 when one segment; zero without). Per chunk:
    Vn = T·X on chip, O = scale·(e^γ·Q·S + (Q·Kᵀ ⊙ E)·Vn), S' = e^{γ_C}·S + Kᵀ·(e^{γ_C−γ} ⊙ Vn);
    STORE_GROUPS keeps the fp32 state entering every group of KG chunks, [B·Hv, NG, D, D]
    (CPS is a multiple of KG, so a segment starts a group), stored at the end of the step before
    it, where the step's tiles are dead.

    The program holds Sᵀ [BV, D] and forms the step transposed, value columns as rows:
    Xᵀ = β⊙Vᵀ − βe^γ⊙(Sᵀ·Kᵀ), Vnᵀ = Xᵀ·Tᵀ, Oᵀ = e^γ⊙(Sᵀ·Qᵀ) + Vnᵀ·Pᵀ with Pᵀ = (K·Qᵀ) ⊙ Eᵀ,
    Sᵀ' = e^{γ_C}·Sᵀ + (e^{γ_C−γ}⊙Vnᵀ)·K (the products and roundings of `chunk_vn` and
    `state_next`). Triton gives every dot of a chain all warps along its rows, 16 each: a
    [BT, D] tile of 64 rows is held by both warp groups of 8 warps, twice its registers, while a
    [BV, BT] tile at BV = 128 fills the 128 rows once.

    Pᵀ, Vnᵀ and (Oᵀ, Sᵀ') are each formed in a loop of one trip, a region of its own: Triton's
    chain rule looks at the dots of one region, so the [BT, BT] Pᵀ (and at BV = 64 every
    product of 64 rows) is split over the two warp groups instead of formed by both, and each
    part reads γ and forms its decay factors where it uses them, not one copy held across the
    other parts. LLVM removes the one-trip loops."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    nseg = tl.num_programs(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    i = tl.arange(0, BT)
    cols = dv[:, None] + dk[None, :] * D  # Sᵀ's elements in the [D, D] state (key rows, value columns)
    dt = q_ptr.dtype.element_ty
    causal = i[None, :] >= i[:, None]  # Pᵀ[j, i]: row i of the chunk sees row j
    if HAS_S0:
        S = tl.load(s0_ptr + (bh * nseg + seg) * D * D + cols).to(tl.float32)
    else:
        S = tl.zeros([BV, D], dtype=tl.float32)
    c0 = seg * CPS
    c1 = tl.minimum(c0 + CPS, NT)
    if STORE_GROUPS:
        tl.store(sg_ptr + (bh * NG + c0 // KG) * D * D + cols, S)
    for c in range(c0, c1):
        t = c * BT + i
        m = t < T
        kc = load_rows(k_ptr + b * T * HQK * D + hk * D, t, m, HQK * D, D)
        qc = load_rows(q_ptr + b * T * HQK * D + hk * D, t, m, HQK * D, D)
        rows = ((b * T + t[None, :]) * HV + h) * D + dv[:, None]  # [BV, BT] of a [B, T, Hv, D] tensor
        # γ under a name per part: a name bound before a loop and again inside it is carried by it.
        p = tl.zeros([BT, BT], dtype=dt)
        for _ in range(c, c + 1):
            g_p = load_gamma(gamma_ptr, bh, c * BT, T, T, BT)[0]
            p = tl.dot(kc, tl.trans(qc))
            p = tl.where(causal, p * tl.exp(tl.where(causal, g_p[None, :] - g_p[:, None], 0.0)), 0.0).to(dt)
        Sb = S.to(dt)
        ks = tl.dot(Sb, tl.trans(kc))
        bt = chunk_beta(beta_ptr, b, h, t, m, T, HV)
        g_x = load_gamma(gamma_ptr, bh, c * BT, T, T, BT)[0]
        v = tl.load(v_ptr + rows, mask=m[None, :], other=0.0)
        vn = tl.zeros([BV, BT], dtype=tl.float32)
        for _ in range(c, c + 1):
            x = v.to(tl.float32) * bt[None, :] - (bt * tl.exp(g_x))[None, :] * ks
            vn = mm(x, tl.trans(chunk_t(tm_ptr, bh, t, m, T, BT)), PREC)
        for _ in range(c, c + 1):
            gam, g_last, _m = load_gamma(gamma_ptr, bh, c * BT, T, T, BT)
            o = tl.dot(vn.to(dt), p) + tl.dot(Sb, tl.trans(qc)) * tl.exp(gam)[None, :]
            tl.store(o_ptr + rows, (o * scale).to(o_ptr.dtype.element_ty), mask=m[None, :])
            vg = (vn * tl.exp(g_last - gam)[None, :]).to(dt)
            S = S * tl.exp(g_last) + tl.dot(vg, kc)
        if STORE_GROUPS:  # noqa: SIM102 (a constexpr and a runtime test: two ifs compile on every Triton)
            if (c + 1) % KG == 0 and c + 1 < c1:
                tl.store(sg_ptr + (bh * NG + (c + 1) // KG) * D * D + cols, S)
    if STORE_HT:  # noqa: SIM102
        if seg == nseg - 1:
            # Offsets formed anew, not `cols`: that kept the entering state's load offsets live
            # across the walk (ptxas spilled them, and the step around them).
            tl.store(ht_ptr + bh * D * D + dv[:, None] + dk[None, :] * D, S)


@triton.jit
def _fused_maps_kernel(
    k_ptr, v_ptr, beta_ptr, gamma_ptr, tm_ptr, m_ptr, e_ptr,
    T, NT, CPS, NSEG, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    """Segment seg's affine map S_out = M·S_in + E, value columns dv (the columns of the state
    are separable): E walked from zero with V, M from I with V = 0, each chunk's Vn formed on chip
    as the forward forms it. Written to m / e [B·Hv, NSEG, D, D] fp32."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    dt = k_ptr.dtype.element_ty
    E = tl.zeros([D, BV], dtype=tl.float32)
    M = (dk[:, None] == dv[None, :]).to(tl.float32)
    c0 = seg * CPS
    c1 = tl.minimum(c0 + CPS, NT)
    for c in range(c0, c1):
        kc, bt, gam, g_last, tmat, t, m = chunk_inputs(
            k_ptr, beta_ptr, gamma_ptr, tm_ptr, b, bh, hk, c * BT, T, HQK, HV, BT, D)
        v = value_rows(v_ptr, b, h, t, m, dv, T, HV, D)
        vn_e, _ = chunk_vn(tmat, kc, v, bt, gam, E.to(dt), PREC)
        vn_m = mm(tmat, -(bt * tl.exp(gam))[:, None] * tl.dot(kc, M.to(dt)), PREC)  # V = 0
        E = state_next(E, vn_e, kc, gam, g_last)
        M = state_next(M, vn_m, kc, gam, g_last)
    off = (bh * NSEG + seg) * D * D + dk[:, None] * D + dv[None, :]
    tl.store(e_ptr + off, E)
    tl.store(m_ptr + off, M)


def fused_segments(batch_qk_heads: int, T: int, device: torch.device, cfg: KernelConfig) -> tuple[int, int]:
    """(segments, chunks per segment) of the fused walks. cfg.seq_segments > 0 forces the count;
    0 chooses about one backward program per multiprocessor (the backward runs one launch per
    value head of a q/k head, B·Hqk programs per segment), each segment at least
    cfg.seq_min_chunks chunks; a CPU counts as one multiprocessor. Segments hold whole groups of
    cfg.fused_group chunks, so each starts at a kept group state."""
    nt = num_chunks(T)
    if cfg.seq_segments > 0:
        want = cfg.seq_segments
    elif device.type != "cuda":
        want = 1
    else:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        want = min(sms // batch_qk_heads, nt // cfg.seq_min_chunks)
    want = max(1, min(want, nt))
    kg = cfg.fused_group
    cps = triton.cdiv(triton.cdiv(nt, want), kg) * kg
    return triton.cdiv(nt, cps), cps


def check_fused(cfg: KernelConfig) -> None:
    """Refuses fused settings the kernels cannot take, naming the value."""
    if cfg.fused_bv not in (64, 128):  # 32 at 8 warps stopped with an illegal memory access on the H100
        raise ValueError(f"fused_bv = {cfg.fused_bv}: expected 64 or 128 (value columns per program)")
    if cfg.fused_maps_bv not in (16, 32, 64, 128):
        raise ValueError(f"fused_maps_bv = {cfg.fused_maps_bv}: expected 16, 32, 64 or 128")
    if cfg.fused_group < 1:
        raise ValueError(f"fused_group = {cfg.fused_group}: expected at least 1 chunk per kept state")
    fused_bwd_parts(cfg)


def fused_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor,
    tm: torch.Tensor, scale: float, initial_state: torch.Tensor | None, *, store_final: bool, keep: bool,
    cfg: KernelConfig,
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor | None, torch.Tensor | None, int]]:
    """o [B, T, Hv, D] in v's dtype, the final fp32 state if asked, and what the fused backward
    takes: (the fp32 group states [B·Hv, NG, D, D] when `keep`, the segment maps M
    [B·Hv, nseg, D, D] when split and `keep`, chunks per segment)."""
    check_fused(cfg)
    B, T, Hqk, _ = q.shape
    Hv = v.shape[2]
    nt = num_chunks(T)
    nseg, cps = fused_segments(B * Hqk, T, q.device, cfg)
    kg = cfg.fused_group
    ng = triton.cdiv(nt, kg)
    prec = dot_precision(cfg, q.dtype, "vn")
    s0 = initial_state.contiguous() if initial_state is not None else None
    maps = None
    if nseg > 1:
        maps = torch.empty(B * Hv, nseg, D, D, device=q.device, dtype=torch.float32)
        ee = torch.empty_like(maps)
        bv = cfg.fused_maps_bv
        _fused_maps_kernel[(D // bv, B * Hv, nseg if keep else nseg - 1)](
            k_ptr=k, v_ptr=v, beta_ptr=beta, gamma_ptr=gamma, tm_ptr=tm, m_ptr=maps, e_ptr=ee,
            T=T, NT=nt, CPS=cps, NSEG=nseg, HQK=Hqk, HV=Hv, R=Hv // Hqk, PREC=prec, BT=BT, D=D, BV=bv,
            num_warps=cfg.fused_maps_warps,
        )
        s0 = segment_scan(maps, ee, s0, reverse=False, cfg=cfg)
        del ee
        if not keep:
            maps = None
    o = torch.empty_like(v)
    ht = torch.empty(B, Hv, D, D, device=q.device, dtype=torch.float32) if store_final else None
    sg = torch.empty(B * Hv, ng, D, D, device=q.device, dtype=torch.float32) if keep else None
    _fused_fwd_kernel[(D // cfg.fused_bv, B * Hv, nseg)](
        q_ptr=q, k_ptr=k, v_ptr=v, beta_ptr=beta, gamma_ptr=gamma, tm_ptr=tm,
        s0_ptr=s0 if s0 is not None else o, o_ptr=o, ht_ptr=ht if ht is not None else o,
        sg_ptr=sg if sg is not None else o, scale=scale, T=T, NT=nt, NG=ng, CPS=cps,
        HQK=Hqk, HV=Hv, R=Hv // Hqk, HAS_S0=s0 is not None, STORE_HT=store_final, STORE_GROUPS=keep,
        PREC=prec, BT=BT, D=D, BV=cfg.fused_bv, KG=kg, num_warps=cfg.fused_fwd_warps,
        num_stages=cfg.fused_fwd_stages,
    )
    return o, ht, (sg, maps, cps)
