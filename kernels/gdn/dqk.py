"""Backward stage 3: per chunk dq, the state/output part of dk, dWk and the γ-gradient partials."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_span, load_gamma, transpose_via
from kernels.gdn.config import BT, D, KernelConfig, kernel_config, num_chunks


# r is not specialised (Triton would compile r == 1 apart): one compile serves every head but the
# first and the last of a group.
@triton.jit(do_not_specialize=["r"])
def _bwd_dqk_kernel(
    q_ptr, k_ptr, vn_ptr, do_ptr, dvn_ptr, s_ptr, ds_ptr, gamma_ptr,
    dq_ptr, dk_ptr, dw_ptr, dgam_ptr, spans_ptr, scale,
    T, NT, r, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    CARRY_IN: tl.constexpr, CARRY_OUT: tl.constexpr, SLOT: tl.constexpr,
    VARLEN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """Columns [ik·BK, (ik+1)·BK) of dq, dk, dWk for one chunk of value head hk·R + r of q/k head
    b·Hqk + hk (program_id 2), from the per-chunk S and dS' ([B·Hv, NT, D, D]). A group's heads
    run one launch each, r = 0 .. R − 1 in order (`dqk_chunk`: dq's running sum passes from
    launch to launch, so the sum has a fixed order and is bitwise reproducible). The dk partial
    goes to chunk slots of SLOT fp32 elements (`dqk_buffers`)."""
    j = tl.program_id(0)
    ik = tl.program_id(1)
    bhk = tl.program_id(2).to(tl.int64)
    b, hk = bhk // HQK, bhk % HQK
    t0, t1 = chunk_span(j, T, spans_ptr, VARLEN, BT)
    bh = b * HV + hk * R + (r if R > 1 else 0)  # R == 1: no runtime head offset at all
    slot = (bh * NT + j) * D * D
    dqk_chunk(
        q_ptr, k_ptr, vn_ptr, do_ptr, dvn_ptr, s_ptr + slot, ds_ptr + slot, s_ptr + (slot - NT * D * D),
        gamma_ptr, dq_ptr, dk_ptr + (bh * NT + j) * SLOT, dw_ptr, dgam_ptr, scale, ik, bh,
        tl.num_programs(2) * R, t0, t1, T, HQK, HV, R, CARRY_IN, CARRY_OUT, BT, D, BK, BV,
    )


@triton.jit
def dqk_chunk(
    q_ptr, k_ptr, vn_ptr, do_ptr, dvn_ptr, s_base, ds_base, s_prev, gamma_ptr,
    dq_ptr, dk_base, dw_ptr, dgam_ptr, scale, ik, bh, NBH, t0, t1, T,
    HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, CARRY_IN: tl.constexpr, CARRY_OUT: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """bwd_dqk's work for the chunk at rows t0 .. t1 of value head bh (of NBH), key columns
    [ik·BK, (ik+1)·BK): S and dS' are the chunk's [D, D] states at `s_base` and `ds_base` (row
    stride D); the dk partial's rows start at `dk_base` (fp32, row stride D).

    Once the chunk's tiles are loaded, the program overwrites what only it reads: rows ik·BK ..
    of S (its share of the state slot) hold dq's running sum, and, where `dqk_buffers` put them
    there, dS' holds the dk partial and Vn holds dWk. dq of a q/k head sums its value heads' terms
    in launch order: CARRY_OUT leaves this head's sum (fp32 [BT, BK]) in its S share instead of
    storing dq, CARRY_IN adds the previous head's (`s_prev`, the same chunk's slot of head bh − 1).
    Every γ-gradient term is linear in the column split, so each key slice writes its own dγ
    partial (summed by the WY stage)."""
    b, h = bh // HV, bh % HV
    hk = h // R
    dkc = ik * BK + tl.arange(0, BK)
    i = tl.arange(0, BT)
    t = t0 + i
    m = t < t1
    qk_off = b * T * HQK * D + hk * D
    q = tl.load(q_ptr + qk_off + t[:, None] * (HQK * D) + dkc[None, :], mask=m[:, None], other=0.0)
    kc = tl.load(k_ptr + qk_off + t[:, None] * (HQK * D) + dkc[None, :], mask=m[:, None], other=0.0)
    dt = q.dtype
    gam, g_last, _ = load_gamma(gamma_ptr, bh, t0, t1, T, BT)
    dq_acc = tl.zeros([BT, BK], dtype=tl.float32)  # dO·Sᵀ
    dk_acc = tl.zeros([BT, BK], dtype=tl.float32)  # Vn·dS'ᵀ
    dw_acc = tl.zeros([BT, BK], dtype=tl.float32)  # dVn·Sᵀ
    dp = tl.zeros([BT, BT], dtype=tl.float32)  # dO·Vnᵀ
    sds = tl.zeros([BK], dtype=tl.float32)  # row sums of S ⊙ dS'
    for iv in range(D // BV):
        dv = iv * BV + tl.arange(0, BV)
        S = tl.load(s_base + dkc[:, None] * D + dv[None, :])  # [BK, BV]
        dS = tl.load(ds_base + dkc[:, None] * D + dv[None, :])
        vn = tl.load(vn_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        dvn = tl.load(dvn_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        do = tl.load(do_ptr + ((b * T + t[:, None]) * HV + h) * D + dv[None, :], mask=m[:, None], other=0.0)
        do = do.to(dt)
        dq_acc += tl.dot(do, tl.trans(S))
        dk_acc += tl.dot(vn, tl.trans(dS))
        dw_acc += tl.dot(dvn, tl.trans(S))
        dp += tl.dot(do, tl.trans(vn))
        sds += tl.sum(S.to(tl.float32) * dS.to(tl.float32), axis=1)
    tl.debug_barrier()  # every warp's S, dS' and Vn loads are done before the slots are overwritten
    causal = i[:, None] >= i[None, :]
    e = tl.where(causal, tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
    dpm = dp * e * scale
    qk = tl.dot(q, tl.trans(kc))  # this program's column share of Q·Kᵀ
    eg = tl.exp(gam)
    ekd = tl.exp(g_last - gam)
    dq = dq_acc * (scale * eg)[:, None] + tl.dot(dpm.to(dt), kc)
    carry = i[:, None] * BK + tl.arange(0, BK)[None, :]  # fp32 [BT, BK] in a BK·D-element share
    f32 = tl.pointer_type(tl.float32)
    if CARRY_IN:
        dq += tl.load((s_prev + ik * BK * D).to(f32) + carry, mask=m[:, None], other=0.0)
    if CARRY_OUT:
        tl.store((s_base + ik * BK * D).to(f32) + carry, dq, mask=m[:, None])
    else:
        dq_off = ((b * T + t[:, None]) * HQK + hk) * D + dkc[None, :]
        tl.store(dq_ptr + dq_off, dq.to(dq_ptr.dtype.element_ty), mask=m[:, None])
    dk_tile = dk_base + i[:, None] * D + dkc[None, :]
    # dpmᵀ through this program's own dk tile (BK >= BT columns; written with dk below)
    dpmt = transpose_via(dk_base + ik * BK, dpm, i, m, D)
    dk = dk_acc * ekd[:, None] + tl.dot(dpmt.to(dt), q)
    z = dpm * qk
    y = ekd * tl.sum(kc.to(tl.float32) * dk_acc, axis=1)
    dgam = scale * eg * tl.sum(dq_acc * q.to(tl.float32), axis=1) + tl.sum(z, axis=1) - tl.sum(z, axis=0) - y
    last = tl.minimum(t1 - 1 - t0, BT - 1)
    dgam += tl.where(i == last, tl.sum(tl.where(m, y, 0.0)) + tl.exp(g_last) * tl.sum(sds), 0.0)
    tl.store(dk_tile, tl.where(m[:, None], dk, 0.0))  # a short chunk's spare slot rows hold zeros
    dw_off = (bh * T + t[:, None]) * D + dkc[None, :]
    tl.store(dw_ptr + dw_off, (-dw_acc).to(dw_ptr.dtype.element_ty), mask=m[:, None])
    tl.store(dgam_ptr + (ik * NBH + bh) * T + t, dgam, mask=m)


def dqk_buffers(
    q: torch.Tensor, num_v_heads: int, cfg: KernelConfig, BK: int, ds: torch.Tensor, vn: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outputs of bwd_dqk's work (`dqk_chunk`) in key slices of BK columns, uninitialised: dq
    ([B, T, Hqk, D] in q's dtype, summed over each q/k head's value heads), the dk partial (fp32,
    per value head in chunk slots [B·Hv, NT, SLOT]: chunk c's rows from the start of slot c, row
    stride D), dWk ([B·Hv, T, D], q's dtype with cfg.dw_low, else fp32) and the dγ partials
    [D/BK, B·Hv, T].

    With one key slice per chunk (BK = D) and cfg.bwd_in_place, a chunk's program is the only
    reader of its dS' slot and of its Vn rows, so the dk partial takes dS' ([B·Hv, NT, D, D]: D·D
    16- or 32-bit elements a slot hold the BT·D fp32 rows) and dWk takes Vn when it has Vn's
    dtype: the backward's largest step then allocates neither (1.5 GiB at 64K, 32 value heads,
    bf16)."""
    B, T, _, _ = q.shape
    if BK < BT or D % BK:
        raise ValueError(f"key slice of {BK} columns: bwd_dqk's work transposes a {BT}x{BT} tile in its "
                         f"dk columns, so it needs at least {BT} columns, and a divisor of {D}")
    BH, NT = ds.shape[0], ds.shape[1]
    if ds.shape != (B * num_v_heads, NT, D, D) or not ds.is_contiguous():
        raise ValueError(f"dS' of shape {tuple(ds.shape)}: expected a contiguous "
                         f"[{B * num_v_heads}, NT, {D}, {D}]")
    in_place = cfg.bwd_in_place and BK == D
    dq = torch.empty_like(q)
    if in_place:
        dkp = ds.view(torch.float32).view(BH, NT, -1)
    else:
        dkp = torch.empty(BH, NT, BT * D, device=q.device, dtype=torch.float32)
    dw_dtype = q.dtype if cfg.dw_low and q.dtype != torch.float32 else torch.float32
    dw = vn if in_place and vn.dtype == dw_dtype else torch.empty(BH, T, D, device=q.device, dtype=dw_dtype)
    dgam = torch.empty(D // BK, BH, T, device=q.device, dtype=torch.float32)
    return dq, dkp, dw, dgam


def bwd_dqk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, gamma: torch.Tensor, s: torch.Tensor,
    ds: torch.Tensor, vn: torch.Tensor, dvn: torch.Tensor, do: torch.Tensor, scale: float,
    spans: torch.Tensor | None = None, *, cfg: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq (final: [B, T, Hqk, D] in q's dtype), the state/output part of dk (fp32, per value
    head, in chunk slots), dWk and the dγ partials [D/BK, B·Hv, T] (`dqk_buffers`); `spans` as in
    `intra_solve`. With grouped heads (Hv = R·Hqk) R launches, one per value head of every group
    (`_bwd_dqk_kernel`). Consumes its inputs: S is overwritten with dq's running sum (grouped
    heads), dS' and Vn may be overwritten with the dk partial and dWk."""
    cfg = cfg or kernel_config(q.dtype, q.device)
    B, T, Hqk, _ = q.shape
    Hv, NT = num_v_heads, num_chunks(T, spans)
    BK = cfg.dqk_bk
    dq, dkp, dw, dgam = dqk_buffers(q, Hv, cfg, BK, ds, vn)
    R = Hv // Hqk
    for r in range(R):
        _bwd_dqk_kernel[(NT, D // BK, B * Hqk)](
            q_ptr=q, k_ptr=k, vn_ptr=vn, do_ptr=do, dvn_ptr=dvn, s_ptr=s, ds_ptr=ds, gamma_ptr=gamma,
            dq_ptr=dq, dk_ptr=dkp, dw_ptr=dw, dgam_ptr=dgam,
            spans_ptr=spans if spans is not None else dq, scale=scale,
            T=T, NT=NT, r=r, HQK=Hqk, HV=Hv, R=R, CARRY_IN=r > 0, CARRY_OUT=r < R - 1,
            SLOT=dkp.stride(1), VARLEN=spans is not None, BT=BT, D=D, BK=BK, BV=cfg.dqk_bv,
            num_warps=cfg.dqk_warps,
        )
    return dq, dkp, dw, dgam
