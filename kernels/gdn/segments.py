"""Sequence-parallel state passes: each segment's affine map (M, E) from a zero start, and the
scan over segments that gives the state entering (forward) or the gradient leaving (reverse)
each segment. The state stage then walks every segment in parallel from its true state."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import load_gamma, load_rows, state_next
from kernels.gdn.config import BT, D, KernelConfig, dot_precision, kernel_config, num_chunks
from kernels.gdn.intra import VnFrom, walk_vn, walk_vn_operands


@triton.jit
def _segment_fwd_summary_kernel(
    k_ptr, w_ptr, u_ptr, v_ptr, beta_ptr, tm_ptr, gamma_ptr, m_ptr, e_ptr,
    T, NT, CPS, NSEG, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, VN_FROM: tl.constexpr,
    WITH_V: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    """Segment seg's affine map S_out = M·S_in + E (columns dv of both): E from S_in = 0 with U,
    M from S_in = I with V = 0, walked together (each chunk's Vn as `intra.walk_vn` forms it).
    Written to m/e [B·Hv, NSEG, D, D] fp32 (the last segment's is never needed)."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    k_base = k_ptr + b * T * HQK * D + hk * D
    E = tl.zeros([D, BV], dtype=tl.float32)
    M = (dk[:, None] == dv[None, :]).to(tl.float32)
    c0 = seg * CPS
    c1 = tl.minimum(c0 + CPS, NT)
    for c in range(c0, c1):
        t = c * BT + tl.arange(0, BT)
        m = t < T
        gam, g_last, _ = load_gamma(gamma_ptr, bh, c * BT, T, T, BT)
        kc = load_rows(k_base, t, m, HQK * D, D)
        ve = walk_vn(E, kc, gam, w_ptr, u_ptr, v_ptr, beta_ptr, tm_ptr, bh, b, h, t, m, dv, T, HV, VN_FROM,
                     WITH_V, PREC, BT, D)
        vm = walk_vn(M, kc, gam, w_ptr, u_ptr, v_ptr, beta_ptr, tm_ptr, bh, b, h, t, m, dv, T, HV, VN_FROM,
                     False, PREC, BT, D)
        E = state_next(E, ve, kc, gam, g_last)
        M = state_next(M, vm, kc, gam, g_last)
    off = (bh * NSEG + seg) * D * D + dk[:, None] * D + dv[None, :]
    tl.store(e_ptr + off, E)
    tl.store(m_ptr + off, M)


@triton.jit
def _segment_scan_kernel(
    m_ptr, e_ptr, x0_ptr, xs_ptr, NSEG,
    HAS_X0: tl.constexpr, REVERSE: tl.constexpr, PREC: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    """Sequential scan over segments of the affine maps, columns dv of the state.
    Forward (REVERSE = 0): X_0 = x0, X_{j+1} = M_j·X_j + E_j (states entering each segment).
    Reverse (REVERSE = 1): X_{NSEG−1} = x0, X_{j−1} = M_jᵀ·X_j + E_j (state gradients leaving
    each segment; M_j is the forward map, whose transpose carries dS back over segment j).
    Writes every X_j to xs [B·Hv, NSEG, D, D] fp32; products at input precision PREC
    (`KernelConfig.f32_dot_scan`)."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    cols = dk[:, None] * D + dv[None, :]
    if HAS_X0:
        X = tl.load(x0_ptr + bh * D * D + cols)
    else:
        X = tl.zeros([D, BV], dtype=tl.float32)
    for i in range(NSEG):
        if REVERSE:
            j = NSEG - 1 - i
        else:
            j = i
        tl.store(xs_ptr + (bh * NSEG + j) * D * D + cols, X)
        if REVERSE:
            if j > 0:
                mt = tl.load(m_ptr + (bh * NSEG + j) * D * D + dk[None, :] * D + dk[:, None])
                X = tl.dot(mt, X, input_precision=PREC) + tl.load(e_ptr + (bh * NSEG + j) * D * D + cols)
        else:
            if j < NSEG - 1:
                mj = tl.load(m_ptr + (bh * NSEG + j) * D * D + dk[:, None] * D + dk[None, :])
                X = tl.dot(mj, X, input_precision=PREC) + tl.load(e_ptr + (bh * NSEG + j) * D * D + cols)


def state_segments(batch_heads: int, T: int, device: torch.device, cfg: KernelConfig) -> int:
    """How many segments the state passes split the sequence into (1 = one sequential walk).

    cfg.seq_segments > 0 forces it (tests); 0 chooses from the shape: none while one walk
    already has at least half as many programs (B·Hv·D/BV) as the device has multiprocessors,
    else enough segments for about cfg.seq_programs_per_sm programs per multiprocessor, each
    segment at least cfg.seq_min_chunks chunks. CPU tensors (the interpreter) count as one
    multiprocessor, so the automatic choice there is 1."""
    nt = num_chunks(T)
    if cfg.seq_segments > 0:
        return _even_segments(nt, cfg.seq_segments)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    programs = batch_heads * (D // cfg.state_bv)
    if 2 * programs > sms:
        # H200: with 128 programs (B·Hv = 32) every split measured slower (16K: 5.11 ms fwd+bwd
        # unsplit, 5.44 with 2 segments, 5.77 with 16); with 32 programs 8 segments cut both
        # passes at 64K from 5.04 to 1.94 ms (docs/kernels.md).
        return 1
    want = cfg.seq_programs_per_sm * sms // programs
    return _even_segments(nt, min(want, nt // cfg.seq_min_chunks))


def _even_segments(nt: int, want: int) -> int:
    """The segment count that `want` gives once every segment holds cdiv(nt, want) chunks (none
    left empty)."""
    want = max(1, min(want, nt))
    return triton.cdiv(nt, triton.cdiv(nt, want))


def segment_forward_summary(
    k: torch.Tensor, w: torch.Tensor | None, u: torch.Tensor | None, gamma: torch.Tensor, num_v_heads: int,
    nseg: int, *, with_last: bool, vn_from: VnFrom | None = None, cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment maps (M, E), [B·Hv, nseg, D, D] fp32, of segments 0 .. nseg−2 (u=None and no
    vn_from: V = 0; w, u and vn_from as in `state_forward`), and of the last segment too when `with_last`
    (the backward's scan needs M of segments 1 .. nseg−1; the forward's needs 0 .. nseg−2)."""
    cfg = cfg or kernel_config(k.dtype, k.device)
    B, T, Hqk, _ = k.shape
    Hv, NT = num_v_heads, num_chunks(T)
    mm = torch.empty(B * Hv, nseg, D, D, device=k.device, dtype=torch.float32)
    ee = torch.empty_like(mm)
    BV = cfg.state_bv
    if nseg > 1:
        _segment_fwd_summary_kernel[(D // BV, B * Hv, nseg if with_last else nseg - 1)](
            k_ptr=k, gamma_ptr=gamma, m_ptr=mm, e_ptr=ee,
            T=T, NT=NT, CPS=triton.cdiv(NT, nseg), NSEG=nseg, HQK=Hqk, HV=Hv, R=Hv // Hqk,
            **walk_vn_operands(w, u, vn_from, k, cfg), BT=BT, D=D, BV=BV, num_warps=cfg.state_warps,
            num_stages=cfg.state_stages,
        )
    return mm, ee


def segment_scan(
    mm: torch.Tensor, ee: torch.Tensor, x0: torch.Tensor | None, *, reverse: bool,
    cfg: KernelConfig | None = None,
) -> torch.Tensor:
    """States entering (forward) or state gradients leaving (reverse) every segment (`cfg`: the
    launch settings of the walks it serves; default: fp32 inputs')."""
    cfg = cfg or kernel_config(torch.float32, mm.device)
    BH, nseg = mm.shape[:2]
    xs = torch.empty_like(mm)
    BV = cfg.state_bv
    _segment_scan_kernel[(D // BV, BH)](
        m_ptr=mm, e_ptr=ee, x0_ptr=x0 if x0 is not None else mm, xs_ptr=xs, NSEG=nseg,
        HAS_X0=x0 is not None, REVERSE=reverse, PREC=dot_precision(cfg, mm.dtype, "scan"), D=D, BV=BV,
        num_warps=cfg.state_warps,
    )
    return xs
