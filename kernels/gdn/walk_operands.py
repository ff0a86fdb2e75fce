"""The state walks' chunk-local operands, formed chunk-parallel ahead of the walks
(`TUNING["walk_operands"]`): Kd = K ⊙ e^{γ_last − γ} for both walks and Qg = scale·Q ⊙ e^γ for
the reverse one.

Why: a walk step is latency-bound (one program per value slice steps through every chunk), and
forming Kd and Qg there puts a 64×128 elementwise pass, the per-row gate loads and a register
transpose between the step's two dependent products. Loaded ready-made, they go through the
walk's software-pipelined loads like Wk and U. Same expressions, same rounding: the walks give
bit-identical results either way."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_span, load_gamma, load_rows, store_rows
from kernels.gdn.config import BT, D, num_chunks


@triton.jit
def _walk_operands_kernel(
    k_ptr, q_ptr, gamma_ptr, kd_ptr, qg_ptr, spans_ptr, scale,
    T, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, WITH_Q: tl.constexpr,
    VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Chunk program_id 0 of value head program_id 1: Kd (and Qg when WITH_Q) in the input dtype,
    head-major [B·Hv, T, D], padded rows 0, exactly as the walks form them."""
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    t0, t1 = chunk_span(c, T, spans_ptr, VARLEN, BT)
    t = t0 + tl.arange(0, BT)
    m = t < t1
    qk_off = b * T * HQK * D + hk * D
    gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
    kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
    store_rows(kd_ptr + bh * T * D, kc * tl.exp(g_last - gam)[:, None], t, m, D, D)
    if WITH_Q:
        q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
        store_rows(qg_ptr + bh * T * D, q * (tl.exp(gam) * scale)[:, None], t, m, D, D)


def walk_operands(
    k: torch.Tensor, gamma: torch.Tensor, num_v_heads: int, *, q: torch.Tensor | None = None,
    scale: float = 1.0, spans: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kd [B·Hv, T, D] and, when `q` is given, Qg [B·Hv, T, D] (else None), in k's dtype.
    `spans`: the chunk table of packed sequences (`chunks.ChunkTable`), as in `intra_solve`."""
    B, T, Hqk, _ = k.shape
    Hv = num_v_heads
    kd = torch.empty(B * Hv, T, D, device=k.device, dtype=k.dtype)
    qg = torch.empty_like(kd) if q is not None else None
    _walk_operands_kernel[(num_chunks(T, spans), B * Hv)](
        k, q if q is not None else k, gamma, kd, qg if qg is not None else kd,
        spans if spans is not None else kd, scale, T, Hqk, Hv, Hv // Hqk,
        WITH_Q=q is not None, VARLEN=spans is not None, BT=BT, D=D,
    )  # fmt: skip
    return kd, qg
