"""Stage 4: the output, O = scale·(e^γ·Q·S + (Q·Kᵀ ⊙ E)·Vn), chunk-parallel."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_span, load_gamma, load_rows
from kernels.gdn.config import BT, D, KernelConfig, kernel_config, num_chunks


@triton.jit
def _output_kernel(
    q_ptr, k_ptr, vn_ptr, s_ptr, gamma_ptr, o_ptr, spans_ptr, scale,
    T, NT, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, VARLEN: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    c = tl.program_id(0)
    iv = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    d = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
    t = t0 + tl.arange(0, BT)
    i = tl.arange(0, BT)
    m = t < t1
    qk_off = b * T * HQK * D + hk * D
    q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
    kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
    S = tl.load(s_ptr + (bh * NT + c) * D * D + d[:, None] * D + dv[None, :])
    vn = tl.load(vn_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
    gam, _, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
    causal = i[:, None] >= i[None, :]
    p = tl.dot(q, tl.trans(kc))
    p = tl.where(causal, p * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
    o = tl.dot(q, S) * tl.exp(gam)[:, None] + tl.dot(p.to(vn.dtype), vn)
    o_off = ((b * T + t[:, None]) * HV + h) * D + dv[None, :]
    tl.store(o_ptr + o_off, (o * scale).to(o_ptr.dtype.element_ty), mask=m[:, None])


def output(
    q: torch.Tensor, k: torch.Tensor, vn: torch.Tensor, s: torch.Tensor, gamma: torch.Tensor,
    num_v_heads: int, scale: float, out_dtype: torch.dtype, spans: torch.Tensor | None = None,
    *, cfg: KernelConfig | None = None,
) -> torch.Tensor:
    """o [B, T, Hv, D] in out_dtype from per-chunk states and Vn; `spans` as in `intra_solve`."""
    cfg = cfg or kernel_config(q.dtype, q.device)
    B, T, Hqk, _ = q.shape
    Hv, BV = num_v_heads, cfg.out_bv
    o = torch.empty(B, T, Hv, D, device=q.device, dtype=out_dtype)
    nt = num_chunks(T, spans)
    _output_kernel[(nt, D // BV, B * Hv)](
        q_ptr=q, k_ptr=k, vn_ptr=vn, s_ptr=s, gamma_ptr=gamma, o_ptr=o,
        spans_ptr=spans if spans is not None else o,
        scale=scale, T=T, NT=nt, HQK=Hqk, HV=Hv, R=Hv // Hqk, VARLEN=spans is not None, BT=BT, D=D, BV=BV,
        num_warps=cfg.output_warps,
    )
    return o
