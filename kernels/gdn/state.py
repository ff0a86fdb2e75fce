"""Stage 3 and its backward: the state passes, sequential in chunks within a segment.

Forward: per-chunk incoming states S, Vn = U − Wk·S and the final state. Reverse: per-chunk dS'
and the full dVn, dh0. Both split the sequence into segments when `state_segments` says so."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import load_gamma, load_rows, state_slot, walk_range, walk_span
from kernels.gdn.config import BT, TUNING, D, chunk_count, tuned
from kernels.gdn.dvn_local import dvn_local
from kernels.gdn.segments import segment_forward_summary, segment_scan, state_segments
from kernels.gdn.walk_operands import walk_operands


@triton.jit
def _state_fwd_kernel(
    k_ptr, w_ptr, u_ptr, gamma_ptr, h0_ptr, s_ptr, vn_ptr, ht_ptr, seq_ptr, spans_ptr, kd_ptr,
    T, NT, CPS, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    HAS_U: tl.constexpr, HAS_H0: tl.constexpr, STORE_S: tl.constexpr, STORE_VN: tl.constexpr,
    STORE_HT: tl.constexpr, VARLEN: tl.constexpr, PRE: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """One segment (program_id 2) of CPS chunks: S starts from h0[bh, seg] (or 0) and walks the
    segment's chunks; the last segment writes the final state. One segment = the whole sequence.
    VARLEN (B = 1): segment n is packed sequence n, chunks seq_ptr[n] .. seq_ptr[n+1] at the
    rows of the chunk table, from h0[n, h] to ht[n, h]; no state crosses a sequence boundary.
    PRE: Kd = K ⊙ e^{γ_last − γ} comes ready-made from kd_ptr (`walk_operands`), so a step loads it
    and γ_last instead of forming it from K and the chunk's γ."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    nseg = tl.num_programs(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    k_base = k_ptr + b * T * HQK * D + hk * D
    dt = w_ptr.dtype.element_ty
    st = state_slot(bh, h, seg, nseg, HV, VARLEN)
    if HAS_H0:
        S = tl.load(h0_ptr + st * D * D + dk[:, None] * D + dv[None, :]).to(tl.float32)
    else:
        S = tl.zeros([D, BV], dtype=tl.float32)
    c0, c1, r0, r1 = walk_range(seq_ptr, spans_ptr, seg, CPS, NT, T, VARLEN)
    if PRE:  # γ_last of the walk's first chunk; each step loads the next one's a step ahead
        f0, f1 = walk_span(c0, c0, r0, r1, T, VARLEN, BT)
        g_next = tl.load(gamma_ptr + bh * T + tl.minimum(f0 + BT - 1, f1 - 1), mask=c1 > c0, other=0.0)
    for c in range(c0, c1):
        if STORE_S:
            tl.store(s_ptr + (bh * NT + c) * D * D + dk[:, None] * D + dv[None, :], S.to(dt))
        t0, t1 = walk_span(c, c0, r0, r1, T, VARLEN, BT)
        t = t0 + tl.arange(0, BT)
        m = t < t1
        wk = tl.load(w_ptr + (bh * T + t[:, None]) * D + dk[None, :], mask=m[:, None], other=0.0)
        if PRE:
            kd = tl.load(kd_ptr + (bh * T + t[:, None]) * D + dk[None, :], mask=m[:, None], other=0.0)
            g_last = g_next
            nxt = tl.minimum(t0 + 2 * BT - 1, t1 - 1)  # chunk c + 1's last row
            g_next = tl.load(gamma_ptr + bh * T + nxt, mask=c + 1 < c1, other=0.0)
        vn = -tl.dot(wk, S.to(dt))
        if HAS_U:
            vn += tl.load(u_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        if STORE_VN:
            tl.store(vn_ptr + (bh * T + t[:, None]) * D + dv[None, :], vn.to(dt), mask=m[:, None])
        if not PRE:
            gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
            kc = load_rows(k_base, t, m, HQK * D, D)
            kd = (kc * tl.exp(g_last - gam)[:, None]).to(dt)
        S = S * tl.exp(g_last) + tl.dot(tl.trans(kd), vn.to(dt))
    if STORE_HT:
        if VARLEN:
            tl.store(ht_ptr + st * D * D + dk[:, None] * D + dv[None, :], S)
        elif seg == nseg - 1:
            tl.store(ht_ptr + bh * D * D + dk[:, None] * D + dv[None, :], S)


@triton.jit
def _state_bwd_kernel(
    q_ptr, k_ptr, w_ptr, do_ptr, dvl_ptr, gamma_ptr, dht_ptr, ds_ptr, dvn_ptr, dh0_ptr, seq_ptr, spans_ptr,
    kd_ptr, qg_ptr, scale,
    T, NT, CPS, SEG0, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    HAS_DHT: tl.constexpr, STORE: tl.constexpr, STORE_DH0: tl.constexpr, ALL_DH0: tl.constexpr,
    VARLEN: tl.constexpr, PRE: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """Segment seg = SEG0 + program_id 2 of CPS chunks, walked in reverse from dht[bh, seg] (or 0).
    STORE: write dS per chunk and dVn. The segment's start gradient goes to dh0[bh, seg] when
    ALL_DH0 (the summary run of every segment), else segment 0's to dh0[bh] when STORE_DH0.
    VARLEN (B = 1, SEG0 = 0): segment n is packed sequence n, chunks seq_ptr[n] .. seq_ptr[n+1],
    walked back from dht[n, h] to dh0[n, h]. PRE: Kd and Qg = scale·Q ⊙ e^γ come ready-made from
    kd_ptr and qg_ptr (`walk_operands`)."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = SEG0 + tl.program_id(2)
    nseg = SEG0 + tl.num_programs(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    qk_off = b * T * HQK * D + hk * D
    dt = w_ptr.dtype.element_ty
    cols = dk[:, None] * D + dv[None, :]
    st = state_slot(bh, h, seg, nseg, HV, VARLEN)
    if HAS_DHT:
        dS = tl.load(dht_ptr + st * D * D + cols).to(tl.float32)
    else:
        dS = tl.zeros([D, BV], dtype=tl.float32)
    c0, c1, r0, r1 = walk_range(seq_ptr, spans_ptr, seg, CPS, NT, T, VARLEN)
    if PRE:  # γ_last of the walk's first chunk (the last one); each step loads the next a step ahead
        f0, f1 = walk_span(c1 - 1, c0, r0, r1, T, VARLEN, BT)
        g_next = tl.load(gamma_ptr + bh * T + tl.minimum(f0 + BT - 1, f1 - 1), mask=c1 > c0, other=0.0)
    for j in range(c1 - c0):
        c = c1 - 1 - j
        if STORE:
            tl.store(ds_ptr + (bh * NT + c) * D * D + cols, dS.to(dt))
        t0, t1 = walk_span(c, c0, r0, r1, T, VARLEN, BT)
        t = t0 + tl.arange(0, BT)
        m = t < t1
        rows = (bh * T + t[:, None]) * D
        if PRE:
            kd = tl.load(kd_ptr + rows + dk[None, :], mask=m[:, None], other=0.0)
            qg = tl.load(qg_ptr + rows + dk[None, :], mask=m[:, None], other=0.0)
            g_last = g_next
            g_next = tl.load(gamma_ptr + bh * T + t0 - 1, mask=c > c0, other=0.0)  # chunk c - 1 is whole
        else:
            gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
            kc = load_rows(k_ptr + qk_off, t, m, HQK * D, D)
            kd = (kc * tl.exp(g_last - gam)[:, None]).to(dt)
        dvn = tl.dot(kd, dS.to(dt))
        dvn += tl.load(dvl_ptr + rows + dv[None, :], mask=m[:, None], other=0.0)
        if STORE:
            tl.store(dvn_ptr + rows + dv[None, :], dvn.to(dt), mask=m[:, None])
        if not PRE:
            q = load_rows(q_ptr + qk_off, t, m, HQK * D, D)
            qg = (q * (tl.exp(gam) * scale)[:, None]).to(dt)
        do = tl.load(do_ptr + ((b * T + t[:, None]) * HV + h) * D + dv[None, :], mask=m[:, None], other=0.0)
        wk = tl.load(w_ptr + rows + dk[None, :], mask=m[:, None], other=0.0)
        dS = dS * tl.exp(g_last) + tl.dot(tl.trans(qg), do.to(dt)) - tl.dot(tl.trans(wk), dvn.to(dt))
    if ALL_DH0:
        tl.store(dh0_ptr + st * D * D + cols, dS)
    elif STORE_DH0:
        if VARLEN:
            tl.store(dh0_ptr + st * D * D + cols, dS)
        elif seg == 0:
            tl.store(dh0_ptr + bh * D * D + cols, dS)


def walk_stages(ready: bool, dtype: torch.dtype, device: torch.device) -> int:
    """Software-pipelining stages of a state walk: `state_stages`, or `ready_stages` for a walk on
    operands formed ahead (`ready`). Unpipelined ready walks are refused on a GPU: on the H200
    (Triton 3.6, bf16) the first launch at 1 stage stopped with an illegal memory access, while
    3 stages ran and passed the GPU tests (docs/kernels.md, "Walk steps on operands formed ahead").
    The interpreter runs them (the CPU tests compare them bit for bit)."""
    if not ready:
        return int(tuned("state_stages", dtype))
    stages = int(tuned("ready_stages", dtype))
    if stages < 2 and device.type == "cuda":
        raise RuntimeError(
            f"walk_operands=1 with ready_stages={stages} for {dtype} inputs: an unpipelined walk on "
            "operands formed ahead stopped with an illegal memory access on the H200 (Triton 3.6); "
            "set ready_stages >= 2, or walk_operands=0 (fp32 inputs need 1 stage: shared memory)"
        )
    return stages


def state_forward(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor | None,
    gamma: torch.Tensor,
    num_v_heads: int,
    initial_state: torch.Tensor | None,
    *,
    store_states: bool,
    store_vn: bool,
    store_final: bool,
    keep_maps: bool = False,
    seq_chunks: torch.Tensor | None = None,
    spans: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Per-chunk incoming states [B·Hv, NT, D, D] (k dtype), Vn [B·Hv, T, D], the final fp32 state
    and, when `keep_maps`, the segment transitions M [B·Hv, nseg, D, D] (None for one segment; the
    backward reuses them transposed).

    With nseg = `state_segments(...)` > 1 the sequence is cut into nseg runs of chunks: every
    segment's affine map (M, E) from a zero start in parallel, a scan over segments for the state
    entering each, then every segment's pass from its true state in parallel. Exact: the same
    recurrence, regrouped. u=None means V = 0 (the transition-product run of the CP summary).

    `seq_chunks` and `spans` (packed sequences, B = 1: `chunks.ChunkTable`): int32 chunk offsets
    of the N sequences and each chunk's rows; each sequence is walked from its own initial state
    [N, Hv, D, D] to its own final state [N, Hv, D, D], all N in parallel in one launch (they are
    the segments; no maps)."""
    B, T, Hqk, _ = k.shape
    Hv, NT = num_v_heads, chunk_count(T, seq_chunks, spans)
    dev = k.device
    n_states = B if seq_chunks is None else seq_chunks.numel() - 1
    s = torch.empty(B * Hv, NT, D, D, device=dev, dtype=k.dtype) if store_states else None
    vn = torch.empty(B * Hv, T, D, device=dev, dtype=k.dtype) if store_vn else None
    ht = torch.empty(n_states, Hv, D, D, device=dev, dtype=torch.float32) if store_final else None
    BV = TUNING["state_bv"]
    ready = bool(TUNING["walk_operands"])
    stages = walk_stages(ready, k.dtype, dev)
    h0 = initial_state.contiguous() if initial_state is not None else None
    nseg = state_segments(B * Hv, T, dev) if seq_chunks is None else n_states
    mm = None
    if nseg > 1 and seq_chunks is None:
        mm, ee = segment_forward_summary(k, w, u, gamma, Hv, nseg, with_last=keep_maps)
        h0 = segment_scan(mm, ee, h0, reverse=False)
        del ee
        if not keep_maps:
            mm = None
    kd = walk_operands(k, gamma, Hv, spans=spans)[0] if ready else None
    _state_fwd_kernel[(D // BV, B * Hv, nseg)](
        k, w, u if u is not None else w, gamma, h0 if h0 is not None else w,
        s if s is not None else w, vn if vn is not None else w, ht if ht is not None else w,
        seq_chunks if seq_chunks is not None else w, spans if spans is not None else w,
        kd if kd is not None else w, T, NT, triton.cdiv(NT, nseg), Hqk, Hv, Hv // Hqk,
        HAS_U=u is not None, HAS_H0=h0 is not None, STORE_S=store_states, STORE_VN=store_vn,
        STORE_HT=store_final, VARLEN=seq_chunks is not None, PRE=ready, BT=BT, D=D, BV=BV,
        num_warps=TUNING["state_warps"], num_stages=stages,
    )  # fmt: skip
    return s, vn, ht, mm


def state_backward(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, do: torch.Tensor, gamma: torch.Tensor,
    dht: torch.Tensor | None, scale: float, *, want_dh0: bool, maps: torch.Tensor | None = None,
    seq_chunks: torch.Tensor | None = None, spans: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Per-chunk dS at chunk ends [B·Hv, NT, D, D], full dVn [B·Hv, T, D] and dh0 (fp32) if asked.

    `maps` are the forward's segment transitions (state_forward's fourth result): with them the
    reverse pass is segmented the same way. Every segment but the first walks back from a zero
    gradient (its affine part), a reverse scan carries dS over segments with Mᵀ, then every
    segment walks back from its true gradient in parallel. `seq_chunks` as in `state_forward`:
    every packed sequence walks back from its own dht [N, Hv, D, D] to its own dh0, in parallel."""
    B, T, Hqk, _ = q.shape
    Hv, NT = do.shape[2], chunk_count(T, seq_chunks, spans)
    R = Hv // Hqk
    if seq_chunks is not None and maps is not None:
        raise ValueError("packed sequences (seq_chunks) walk one segment per sequence: no segment maps")
    ready = bool(TUNING["walk_operands"])
    stages = walk_stages(ready, q.dtype, q.device)
    dvl = dvn_local(q, k, do, gamma, scale, spans)
    ds = torch.empty(B * Hv, NT, D, D, device=q.device, dtype=q.dtype)
    dvn = torch.empty_like(dvl)
    n_states = B if seq_chunks is None else seq_chunks.numel() - 1
    dh0 = torch.empty(n_states, Hv, D, D, device=q.device, dtype=torch.float32) if want_dh0 else None
    BV = TUNING["state_bv"]
    nseg = (1 if maps is None else maps.shape[1]) if seq_chunks is None else n_states
    cps = triton.cdiv(NT, nseg)
    kd, qg = walk_operands(k, gamma, Hv, q=q, scale=scale, spans=spans) if ready else (w, w)
    common = dict(PRE=ready, BT=BT, D=D, BV=BV, num_warps=TUNING["state_warps"], num_stages=stages)
    dend = dht
    if nseg > 1 and seq_chunks is None:
        dext = torch.empty(B * Hv, nseg, D, D, device=q.device, dtype=torch.float32)
        _state_bwd_kernel[(D // BV, B * Hv, nseg - 1)](
            q, k, w, do, dvl, gamma, w, w, w, dext, w, w, kd, qg, scale, T, NT, cps, 1, Hqk, Hv, R,
            HAS_DHT=False, STORE=False, STORE_DH0=False, ALL_DH0=True, VARLEN=False, **common,
        )  # fmt: skip
        dend = segment_scan(maps, dext, dht, reverse=True)
        del dext
    _state_bwd_kernel[(D // BV, B * Hv, nseg)](
        q, k, w, do, dvl, gamma, dend if dend is not None else w, ds, dvn, dh0 if dh0 is not None else w,
        seq_chunks if seq_chunks is not None else w, spans if spans is not None else w,
        kd, qg, scale, T, NT, cps, 0, Hqk, Hv, R,
        HAS_DHT=dend is not None, STORE=True, STORE_DH0=want_dh0, ALL_DH0=False,
        VARLEN=seq_chunks is not None, **common,
    )  # fmt: skip
    return ds, dvn, dh0
