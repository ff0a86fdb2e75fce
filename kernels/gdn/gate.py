"""Stage 1: chunk-local cumulative sums of the log gates (γ)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_span
from kernels.gdn.config import BT, num_chunks


@triton.jit
def _gate_cumsum_kernel(
    g_ptr, gamma_ptr, spans_ptr, T, H: tl.constexpr, VARLEN: tl.constexpr, BT: tl.constexpr
):
    """γ[bh, t] = Σ_{s in chunk, s<=t} g[b, s, h]; γ is head-major [B·H, T] fp32."""
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
    t = t0 + tl.arange(0, BT)
    m = t < t1
    g = tl.load(g_ptr + (b * T + t) * H + h, mask=m, other=0.0).to(tl.float32)
    tl.store(gamma_ptr + bh * T + t, tl.cumsum(g, axis=0), mask=m)


def gate_cumsum(g: torch.Tensor, spans: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T, H] log gates -> [B·H, T] fp32 chunk-local cumulative sums. `spans`: the chunk
    table of packed sequences (`chunks.ChunkTable`), whose chunks restart at every sequence."""
    B, T, H = g.shape
    gamma = torch.empty(B * H, T, device=g.device, dtype=torch.float32)
    nt = num_chunks(T, spans)
    _gate_cumsum_kernel[(nt, B * H)](
        g, gamma, spans if spans is not None else gamma, T, H, VARLEN=spans is not None, BT=BT
    )
    return gamma
