"""Fused forward per segment: the state walk and the output in one kernel.

One program walks one segment's chunks for BV value columns of one head with the state S in
registers; per chunk it forms Vn = U − Wk·S, the chunk's output O = scale·(e^γ·Q·S + (Q·Kᵀ ⊙ E)·Vn)
and the next state, so the output never reads S or Vn back from memory and, when no backward
follows, per-chunk S and Vn are never stored at all. With several segments each one starts from
its true incoming state, given by the segment maps and their scan (`segments`): exact, the same
recurrence regrouped.

The intra-chunk solve (T, Wk, U) stays its own stage: this grid splits the value columns over
D/BV programs per head, and a solve inside the walk would be repeated by each of them on the
sequential path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import load_gamma, load_rows, state_slot, walk_range, walk_span
from kernels.gdn.config import BT, TUNING, D, chunk_count, tuned
from kernels.gdn.segments import segment_forward_summary, segment_scan, state_segments

Opt = torch.Tensor | None


@triton.jit
def _fused_fwd_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, gamma_ptr, h0_ptr, o_ptr, s_ptr, vn_ptr, ht_ptr, seq_ptr, spans_ptr,
    scale,
    T, NT, CPS, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_S: tl.constexpr, STORE_VN: tl.constexpr, STORE_HT: tl.constexpr,
    VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """Segment program_id 2 (CPS chunks) of head program_id 1, value columns program_id 0: S
    starts from h0[bh, seg] (or 0); the last segment writes the final state. VARLEN (B = 1):
    segment n is packed sequence n, chunks seq_ptr[n] .. seq_ptr[n+1], from h0[n, h] to ht[n, h]."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    nseg = tl.num_programs(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    i = tl.arange(0, BT)
    causal = i[:, None] >= i[None, :]
    qk_base = b * T * HQK * D + hk * D
    dt = w_ptr.dtype.element_ty
    cols = dk[:, None] * D + dv[None, :]
    st = state_slot(bh, h, seg, nseg, HV, VARLEN)
    if HAS_H0:
        S = tl.load(h0_ptr + st * D * D + cols).to(tl.float32)
    else:
        S = tl.zeros([D, BV], dtype=tl.float32)
    c0, c1, r0, r1 = walk_range(seq_ptr, spans_ptr, seg, CPS, NT, T, VARLEN)
    for c in range(c0, c1):
        sd = S.to(dt)
        if STORE_S:
            tl.store(s_ptr + (bh * NT + c) * D * D + cols, sd)
        t0, t1 = walk_span(c, c0, r0, r1, T, VARLEN, BT)
        t = t0 + i
        m = t < t1
        wk = tl.load(w_ptr + (bh * T + t[:, None]) * D + dk[None, :], mask=m[:, None], other=0.0)
        u = tl.load(u_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        vn = u.to(tl.float32) - tl.dot(wk, sd)
        vnd = vn.to(dt)
        if STORE_VN:
            tl.store(vn_ptr + (bh * T + t[:, None]) * D + dv[None, :], vnd, mask=m[:, None])
        gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
        q = load_rows(q_ptr + qk_base, t, m, HQK * D, D)
        kc = load_rows(k_ptr + qk_base, t, m, HQK * D, D)
        p = tl.dot(q, tl.trans(kc))
        p = tl.where(causal, p * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
        o = tl.dot(q, sd) * tl.exp(gam)[:, None] + tl.dot(p.to(dt), vnd)
        o_off = ((b * T + t[:, None]) * HV + h) * D + dv[None, :]
        tl.store(o_ptr + o_off, (o * scale).to(o_ptr.dtype.element_ty), mask=m[:, None])
        kd = (kc * tl.exp(g_last - gam)[:, None]).to(dt)
        S = S * tl.exp(g_last) + tl.dot(tl.trans(kd), vnd)
    if STORE_HT:
        if VARLEN:
            tl.store(ht_ptr + st * D * D + cols, S)
        elif seg == nseg - 1:
            tl.store(ht_ptr + bh * D * D + cols, S)


def fused_forward(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, gamma: torch.Tensor,
    num_v_heads: int, scale: float, out_dtype: torch.dtype, initial_state: torch.Tensor | None, *,
    store_states: bool, store_vn: bool, store_final: bool, keep_maps: bool = False,
    seq_chunks: Opt = None, spans: Opt = None,
) -> tuple[torch.Tensor, Opt, Opt, Opt, Opt]:  # fmt: skip
    """o [B, T, Hv, D] in out_dtype, and as asked the per-chunk incoming states [B·Hv, NT, D, D],
    Vn [B·Hv, T, D] (k's dtype; the backward reads them), the final fp32 state and, when
    `keep_maps`, the segment transitions M (None for one segment), as `state_forward` returns
    them. The segment count is `state_segments`'s, as in the unfused passes; with `seq_chunks`
    and `spans` (packed sequences) one segment per sequence, as `state_forward` walks them."""
    B, T, Hqk, _ = q.shape
    Hv, NT = num_v_heads, chunk_count(T, seq_chunks, spans)
    dev = q.device
    o = torch.empty(B, T, Hv, D, device=dev, dtype=out_dtype)
    s = torch.empty(B * Hv, NT, D, D, device=dev, dtype=k.dtype) if store_states else None
    vn = torch.empty(B * Hv, T, D, device=dev, dtype=k.dtype) if store_vn else None
    n_states = B if seq_chunks is None else seq_chunks.numel() - 1
    ht = torch.empty(n_states, Hv, D, D, device=dev, dtype=torch.float32) if store_final else None
    h0 = initial_state.contiguous() if initial_state is not None else None
    nseg = state_segments(B * Hv, T, dev) if seq_chunks is None else n_states
    maps = None
    if nseg > 1 and seq_chunks is None:
        maps, ee = segment_forward_summary(k, w, u, gamma, Hv, nseg, with_last=keep_maps)
        h0 = segment_scan(maps, ee, h0, reverse=False)
        del ee
        if not keep_maps:
            maps = None
    BV = int(TUNING["fused_bv"])
    _fused_fwd_kernel[(D // BV, B * Hv, nseg)](
        q, k, w, u, gamma, h0 if h0 is not None else w, o,
        s if s is not None else w, vn if vn is not None else w, ht if ht is not None else w,
        seq_chunks if seq_chunks is not None else w, spans if spans is not None else w, scale,
        T, NT, triton.cdiv(NT, nseg), Hqk, Hv, Hv // Hqk,
        HAS_H0=h0 is not None, STORE_S=store_states, STORE_VN=store_vn, STORE_HT=store_final,
        VARLEN=seq_chunks is not None, BT=BT, D=D, BV=BV, num_warps=TUNING["fused_warps"],
        num_stages=tuned("fused_stages", k.dtype),
    )  # fmt: skip
    return o, s, vn, ht, maps
