"""Backward stage 1: the intra-chunk part of dVn, scale·(K·Qᵀ ⊙ Eᵀ)·dO (the output stage's
attention term, transposed)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_span, load_gamma, load_rows
from kernels.gdn.config import BT, D, KernelConfig, kernel_config, num_chunks


@triton.jit
def local_dvn(kc, q, do, gam, scale, BT: tl.constexpr):
    """scale·(K·Qᵀ ⊙ Eᵀ)·dO of one chunk (fp32) from its K, Q, dO tiles (masked rows zero) and γ:
    this stage's body, and the reverse walk's when it forms the term in its step
    (`KernelConfig.dvl_in_walk`)."""
    i = tl.arange(0, BT)
    up = i[:, None] <= i[None, :]  # key i, query j >= i
    pt = tl.dot(kc, tl.trans(q))
    pt = tl.where(up, pt * tl.exp(tl.where(up, gam[None, :] - gam[:, None], 0.0)), 0.0) * scale
    return tl.dot(pt.to(do.dtype), do)


@triton.jit
def _dvn_local_kernel(
    q_ptr, k_ptr, do_ptr, gamma_ptr, dvl_ptr, spans_ptr, scale,
    T, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, VARLEN: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr,
):
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    d = tl.arange(0, D)
    t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
    t = t0 + tl.arange(0, BT)
    m = t < t1
    qk_off = b * T * HQK * D + hk * D
    q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
    kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
    do = load_rows(do_ptr + b * T * HV * D + h * D, t, m, HV * D, D)
    gam, _, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
    dvl = local_dvn(kc, q, do, gam, scale, BT)
    tl.store(dvl_ptr + (bh * T + t[:, None]) * D + d[None, :], dvl.to(dvl_ptr.dtype.element_ty),
             mask=m[:, None])


def dvn_local(
    q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, gamma: torch.Tensor, scale: float,
    spans: torch.Tensor | None = None, *, cfg: KernelConfig | None = None,
) -> torch.Tensor:
    """The intra-chunk part of dVn, [B·Hv, T, D] in q's dtype; `spans` as in `intra_solve`."""
    cfg = cfg or kernel_config(q.dtype, q.device)
    B, T, Hqk, _ = q.shape
    Hv = do.shape[2]
    dvl = torch.empty(B * Hv, T, D, device=q.device, dtype=q.dtype)
    nt = num_chunks(T, spans)
    _dvn_local_kernel[(nt, B * Hv)](
        q_ptr=q, k_ptr=k, do_ptr=do, gamma_ptr=gamma, dvl_ptr=dvl,
        spans_ptr=spans if spans is not None else dvl,
        scale=scale, T=T, HQK=Hqk, HV=Hv, R=Hv // Hqk, VARLEN=spans is not None, BT=BT, D=D,
        num_warps=cfg.dvl_warps,
    )
    return dvl
