"""Stage 1: chunk-local cumulative sums of the log gates (γ)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.config import BT, num_chunks


@triton.jit
def _gate_cumsum_kernel(g_ptr, gamma_ptr, T, H: tl.constexpr, BT: tl.constexpr):
    """γ[bh, t] = Σ_{s in chunk, s<=t} g[b, s, h]; γ is head-major [B·H, T] fp32."""
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    t = c * BT + tl.arange(0, BT)
    m = t < T
    g = tl.load(g_ptr + (b * T + t) * H + h, mask=m, other=0.0).to(tl.float32)
    tl.store(gamma_ptr + bh * T + t, tl.cumsum(g, axis=0), mask=m)


def gate_cumsum(g: torch.Tensor) -> torch.Tensor:
    """[B, T, H] log gates -> [B·H, T] fp32 chunk-local cumulative sums."""
    B, T, H = g.shape
    gamma = torch.empty(B * H, T, device=g.device, dtype=torch.float32)
    _gate_cumsum_kernel[(num_chunks(T), B * H)](g, gamma, T, H, BT)
    return gamma
