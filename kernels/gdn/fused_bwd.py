"""The fused backward: one program walks a segment of a value head backwards, its dS [D, BV]
(`fused_bwd_bv` value columns: 128, the whole state, or a slice) its own, and does every
gradient of each chunk there (dq, dk, dv, dβ, dg and, at the start, dh0): the reverse walk and
the WY backward together, so no dVn, dS', dWk, fp32 dk partial or dγ partial reaches memory.
Every gradient is a sum over value columns of terms of those columns alone, so a slice's program
forms its part, and the parts meet in fp32 running sums in a fixed launch order.

Register pressure, not arithmetic, bounds the step on sm_90 (one 8-warp program per
multiprocessor at 255 registers): dS and the re-walk's state (fp32) sit in the program's scratch,
never in registers across a step; the step runs its value and key columns in parts of at least
`FUSED_BWD_MIN_PART` columns (`config.fused_bwd_parts`) as loops that are not unrolled (unrolled,
the compiler hoisted the later parts' loads and spilled); K, Q and T are read where each product
needs them (L1 or L2 hits) and the decay tiles formed where used, instead of held across them.
A product whose result reaches another product (as its operand, or as the accumulator Triton
folds `x + a·b` into, or through a loop that takes it as an initial value) is laid out with all
8 warps along its rows (Triton's `warpsPerTileV3`): a 64-row tile is then held whole by both warp
groups, twice the registers of the 4 × 2 layout the others get. So the step sends such results
through the scratch where that pays: dP ⊙ E and dPᵀ ⊙ Eᵀ (in the input dtype, read back by each
key part), Tᵀ·dT, and B (read back with its transpose by each key part); dP and dPᵀ are products
over all the program's value columns after the value parts, not sums carried through them; and
the key parts sum their γ term from zero instead of taking the step's dγ. Other products are
cut off from the product they feed by a loop of one trip around them (a region of its own,
which Triton's chain rule does not look out of; LLVM removes the loop): the re-walk's K·S and
T·X, the value parts' K·dS' and dVn, the key parts' dO·Sᵀ, dq, dX·Sᵀ with Vn·dS'ᵀ, and dk's
terms before (B + Bᵀ)·K.

It reads what the fused forward kept: T and the fp32 state entering every group of
`fused_group` chunks. Group by group from the end, it re-walks the group forward from its state
(the forward's own steps, `common.chunk_vn`'s products and `state_next`) into a scratch of its
own (each chunk's S, X and Vn in the input dtype, a few hundred KB per program that stays in L2), then
walks the group's chunks back. A head's segments start from the gradients the reverse scan of
the segment maps gives (`_fused_dmaps_kernel`: each segment's affine part from a zero gradient).

Per chunk, with X = β⊙V − βe^γ⊙(K·S), Vn = T·X, E the causal decay and Kd = K ⊙ e^{γ_C−γ}:

    dVn = scale·(K·Qᵀ ⊙ Eᵀ)·dO + Kd·dS'           dX = Tᵀ·dVn,  dT = dVn·Xᵀ,  dA = −Tᵀ·dT·Tᵀ
    dS  = e^{γ_C}·dS' + Qᵀ·(scale·e^γ ⊙ dO) − Kᵀ·(βe^γ ⊙ dX)
    dq  = scale·e^γ ⊙ (dO·Sᵀ) + (scale·dO·Vnᵀ ⊙ E)·K
    dk  = (scale·Vn·dOᵀ ⊙ Eᵀ)·Q − βe^γ ⊙ (dX·Sᵀ) + e^{γ_C−γ} ⊙ (Vn·dS'ᵀ) + (B + Bᵀ)·K
          with B = β ⊙ dA ⊙ e^{γ_i−γ_j}
    dv  = β ⊙ dX

with the γ terms of every decay summed per row and turned into dg by a reverse cumulative sum.
No transposed product result feeds another product (Triton 3.4–3.7.0 miscompile that on
Hopper): Vn·dOᵀ, K·Qᵀ and Vn·dS'ᵀ are products of loaded tiles (dS' read back from the scratch),
and B goes through the scratch, read back as B and Bᵀ.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn.common import chunk_t, load_rows, mm, state_next, value_rows
from kernels.gdn.config import BT, D, KernelConfig, dot_precision, fused_bwd_parts, num_chunks
from kernels.gdn.fused_fwd import check_fused, chunk_inputs
from kernels.gdn.segments import segment_scan


@triton.jit
def _fused_dmaps_kernel(
    q_ptr, k_ptr, beta_ptr, gamma_ptr, tm_ptr, do_ptr, dext_ptr, scale,
    T, NT, CPS, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    """Segment 1 + program_id 2's affine part of the reverse map, value columns dv (separable):
    the gradient entering the segment when the one leaving it is zero, dS_start = Mᵀ·dS_end + dE;
    written to dext [B·Hv, nseg, D, D]."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = 1 + tl.program_id(2)
    nseg = 1 + tl.num_programs(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    i = tl.arange(0, BT)
    dt = q_ptr.dtype.element_ty
    up = i[:, None] <= i[None, :]
    dS = tl.zeros([D, BV], dtype=tl.float32)
    c0 = seg * CPS
    c1 = tl.minimum(c0 + CPS, NT)
    for jj in range(c1 - c0):
        c = c1 - 1 - jj
        kc, bt, gam, g_last, tmat, t, m = chunk_inputs(
            k_ptr, beta_ptr, gamma_ptr, tm_ptr, b, bh, hk, c * BT, T, HQK, HV, BT, D)
        qc = load_rows(q_ptr + b * T * HQK * D + hk * D, t, m, HQK * D, D)
        do = value_rows(do_ptr, b, h, t, m, dv, T, HV, D)
        eg = tl.exp(gam)
        et = tl.where(up, tl.exp(tl.where(up, gam[None, :] - gam[:, None], 0.0)), 0.0)
        kqt = tl.dot(kc, tl.trans(qc)) * et * scale
        dvn = tl.dot(kqt.to(dt), do) + tl.dot(kc, dS.to(dt)) * tl.exp(g_last - gam)[:, None]
        dx = mm(tl.trans(tmat), dvn, PREC)
        dog = (do.to(tl.float32) * (scale * eg)[:, None]).to(dt)
        dxg = (dx * (bt * eg)[:, None]).to(dt)
        dS = dS * tl.exp(g_last) + tl.dot(tl.trans(qc), dog) - tl.dot(tl.trans(kc), dxg)
    tl.store(dext_ptr + (bh * nseg + seg) * D * D + dk[:, None] * D + dv[None, :], dS)


@triton.jit
def decay_t(gam, i):
    """Eᵀ of a chunk: e^{γ_j−γ_i} on and above the diagonal, 0 below."""
    up = i[:, None] <= i[None, :]
    return tl.where(up, tl.exp(tl.where(up, gam[None, :] - gam[:, None], 0.0)), 0.0)


@triton.jit(do_not_specialize=["r", "iv"])
def _fused_bwd_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, gamma_ptr, tm_ptr, sg_ptr, do_ptr, dend_ptr,
    dq_ptr, dk_ptr, dv_ptr, dbeta_ptr, dg_ptr, dh0_ptr, dq32_ptr, dk32_ptr, db32_ptr, dg32_ptr,
    scr_ptr, scr32_ptr, scale,
    T, NT, NG, CPS, r, iv, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, HAS_DEND: tl.constexpr,
    STORE_DH0: tl.constexpr, CARRY_IN: tl.constexpr, CARRY_OUT: tl.constexpr,
    VCARRY_IN: tl.constexpr, VCARRY_OUT: tl.constexpr, PREC: tl.constexpr,
    PREC_DT: tl.constexpr, PREC_DA: tl.constexpr, PREC_DX: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr, KG: tl.constexpr, HDV: tl.constexpr,
    HDK: tl.constexpr,
):
    """Value columns iv·BV .. (iv + 1)·BV of value head hk·R + r of q/k head b·Hqk + hk
    (program_id 0), segment program_id 1 of CPS chunks, from the gradient leaving it dend[bh, seg]
    (dHT when one segment; zero without). Every gradient is a sum over value columns of terms of
    those columns alone, so a program forms its slice's part. The slices of a value head, and the
    value heads of a group, run one launch each in a fixed order (r, then iv): dq and dk go
    through fp32 running sums (dq32, dk32 [B, T, Hqk, D]: CARRY_IN adds the earlier launches',
    CARRY_OUT leaves the sum there instead of storing the input-dtype result), dβ and the
    per-row dg terms likewise over a head's slices (db32, dg32 [B, T, Hv]: VCARRY_IN,
    VCARRY_OUT), so the sums repeat bit for bit."""
    bhk = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    nseg = tl.num_programs(1)
    b, hk = bhk // HQK, bhk % HQK
    h = hk * R + (r if R > 1 else 0)
    bh = b * HV + h
    dk = tl.arange(0, D)
    vv = tl.arange(0, BV)
    vcol = iv * BV + vv  # the program's value columns
    i = tl.arange(0, BT)
    dt = q_ptr.dtype.element_ty
    sq = dk[:, None] * BV + vv[None, :]  # a [D, BV] state slice in the scratch
    sq_g = dk[:, None] * D + vcol[None, :]  # the same slice of a [D, D] state in memory
    rows = i[:, None] * BV + vv[None, :]  # a [BT, BV] chunk tile in the scratch
    slot_len = D * BV + 2 * BT * BV
    sqt = i[:, None] * BT + i[None, :]  # a [BT, BT] tile in the scratch
    sqt_t = i[None, :] * BT + i[:, None]  # its transpose
    scr = scr_ptr + (bhk * nseg + seg) * (KG * slot_len + 2 * D * BV + BT * BV + 2 * BT * BT)
    dsb0 = scr + KG * slot_len  # dS in the input dtype beside the fp32 one: the products' operand
    dxs_ptr = dsb0 + 2 * D * BV  # the step's dX [BT, BV], an operand of dX·Sᵀ read back whole
    dpe_ptr = dxs_ptr + BT * BV  # the step's dP ⊙ E and dPᵀ ⊙ Eᵀ, read back by each key part
    # dS lives in two fp32 [D, BV] buffers of the program's scratch, read from one and written to
    # the other each step (so no state tile stays in registers across a step); then BT x BT fp32
    # for Tᵀ·dT and for B
    ds0 = scr32_ptr + (bhk * nseg + seg) * (3 * D * BV + BT * BT)
    s32 = ds0 + 2 * D * BV  # the re-walk's state
    tr = s32 + D * BV
    if HAS_DEND:
        dS = tl.load(dend_ptr + (bh * nseg + seg) * D * D + sq_g)
    else:
        dS = tl.zeros([D, BV], dtype=tl.float32)
    tl.store(ds0 + sq, dS)
    tl.store(dsb0 + sq, dS.to(dt))
    p = 0
    c0 = seg * CPS
    c1 = tl.minimum(c0 + CPS, NT)
    g_lo = c0 // KG
    g_hi = (c1 + KG - 1) // KG
    for gi in range(g_hi - g_lo):
        g = g_hi - 1 - gi
        ca = g * KG
        cb = tl.minimum(ca + KG, c1)
        # the group re-walked from its kept state: each chunk's S, X and Vn into the scratch, the
        # state itself (fp32) in the scratch too and stepped in parts of HDV value columns (the
        # columns are separable), so that no [D, BV] state tile stays in registers across a chunk
        tl.store(s32 + sq, tl.load(sg_ptr + (bh * NG + g) * D * D + sq_g))
        for c in range(ca, cb):
            kc, bt, gam, g_last, tmat, t, m = chunk_inputs(
                k_ptr, beta_ptr, gamma_ptr, tm_ptr, b, bh, hk, c * BT, T, HQK, HV, BT, D)
            slot = scr + (c - ca) * slot_len
            for hv in range(0, BV, HDV):
                vloc = hv + tl.arange(0, HDV)
                part = i[:, None] * BV + vloc[None, :]
                sq_h = dk[:, None] * BV + vloc[None, :]
                tl.debug_barrier()  # the last part's or chunk's stores of this state part first
                S = tl.load(s32 + sq_h)
                Sb = S.to(dt)
                v_h = value_rows(v_ptr, b, h, t, m, iv * BV + vloc, T, HV, D)
                # `chunk_vn` with K·S and T·X each in a loop of one trip (see the back step)
                ks = tl.zeros([BT, HDV], dtype=tl.float32)
                for _r in range(c, c + 1):
                    ks = tl.dot(kc, Sb)
                x = v_h.to(tl.float32) * bt[:, None] - (bt * tl.exp(gam))[:, None] * ks
                vn = tl.zeros([BT, HDV], dtype=tl.float32)
                for _r in range(c, c + 1):
                    vn = mm(tmat, x, PREC)
                tl.store(slot + sq_h, Sb)
                tl.store(slot + D * BV + part, x.to(dt))
                tl.store(slot + D * BV + BT * BV + part, vn.to(dt))
                S = state_next(S, vn, kc, gam, g_last)
                tl.debug_barrier()  # every warp's loads of this state part before its stores
                tl.store(s32 + sq_h, S)
        for jj in range(cb - ca):
            # every warp's stores (the re-walk's, the last step's dS and dX) before any warp's
            # loads, and the last step's loads of what this step overwrites before its stores
            tl.debug_barrier()
            c = cb - 1 - jj
            slot = scr + (c - ca) * slot_len
            ds_in = ds0 + p * D * BV  # dS' leaving the chunk (fp32; dsb_in: in the input dtype)
            ds_out = ds0 + (1 - p) * D * BV  # dS entering it
            dsb_in = dsb0 + p * D * BV
            dsb_out = dsb0 + (1 - p) * D * BV
            p = 1 - p
            # K, Q and T are read where used (L1 or L2 hits), not held in registers across the step
            _, bt, gam, g_last, _, t, m = chunk_inputs(
                k_ptr, beta_ptr, gamma_ptr, tm_ptr, b, bh, hk, c * BT, T, HQK, HV, BT, D)
            q_base = q_ptr + b * T * HQK * D + hk * D
            k_base = k_ptr + b * T * HQK * D + hk * D
            eg = tl.exp(gam)
            ekd = tl.exp(g_last - gam)
            bge = bt * eg
            kqt = tl.dot(load_rows(k_base, t, m, HQK * D, D), tl.trans(load_rows(q_base, t, m, HQK * D, D)))
            kqt = (kqt * decay_t(gam, i) * scale).to(dt)
            # value parts of HDV columns: dVn, dX (into the scratch), dv, the dS update of those
            # columns; dT and dX·V summed over the parts
            dtm = tl.zeros([BT, BT], dtype=tl.float32)
            dbeta = tl.zeros([BT], dtype=tl.float32)
            for hv in range(0, BV, HDV):
                vloc = hv + tl.arange(0, HDV)
                vglob = iv * BV + vloc
                part = i[:, None] * BV + vloc[None, :]
                sq_h = dk[:, None] * BV + vloc[None, :]
                do_h = value_rows(do_ptr, b, h, t, m, vglob, T, HV, D)
                # a loop of one trip is a region of its own: Triton's chain rule (all 8 warps
                # along the rows) follows a product's result within its region, not out of a
                # loop, so K·dS', dVn, dO·Sᵀ, dq, dX·Sᵀ and dS'·Vn, and dk's attention term are
                # split over the two warp groups; LLVM removes the loops
                kds = tl.zeros([BT, HDV], dtype=tl.float32)
                for _r in range(c, c + 1):
                    kds = tl.dot(load_rows(k_base, t, m, HQK * D, D), tl.load(dsb_in + sq_h))
                dvn = tl.zeros([BT, HDV], dtype=tl.float32)
                for _r in range(c, c + 1):
                    dvn = tl.dot(kqt, do_h) + kds * ekd[:, None]
                dx = mm(tl.trans(chunk_t(tm_ptr, bh, t, m, T, BT)), dvn, PREC)
                tl.store(dv_ptr + ((b * T + t[:, None]) * HV + h) * D + vglob[None, :],
                         (dx * bt[:, None]).to(dv_ptr.dtype.element_ty), mask=m[:, None])
                dtm += mm(dvn, tl.trans(tl.load(slot + D * BV + part).to(tl.float32)), PREC_DT)
                tl.store(dxs_ptr + part, dx.to(dt))
                v_h = value_rows(v_ptr, b, h, t, m, vglob, T, HV, D).to(tl.float32)
                dbeta += tl.sum(dx * v_h, axis=1)
                dog = (do_h.to(tl.float32) * (scale * eg)[:, None]).to(dt)
                dxg = (-dx * bge[:, None]).to(dt)
                ds_h = tl.load(ds_in + sq_h) * tl.exp(g_last)
                ds_h = tl.dot(tl.trans(load_rows(q_base, t, m, HQK * D, D)), dog, ds_h)
                ds_h = tl.dot(tl.trans(load_rows(k_base, t, m, HQK * D, D)), dxg, ds_h)
                tl.store(ds_out + sq_h, ds_h)
                tl.store(dsb_out + sq_h, ds_h.to(dt))
            # the attention terms first, products of loaded tiles over all the program's value
            # columns: dP ⊙ E for dq and its transpose for dk go to the scratch in the input dtype,
            # and their γ terms (E: the causal decay e^{γ_i−γ_j}, which dA's strict triangle shares)
            do = value_rows(do_ptr, b, h, t, m, vcol, T, HV, D)
            vn = tl.load(slot + D * BV + BT * BV + rows)
            dp = tl.dot(do, tl.trans(vn))
            dpt = tl.dot(vn, tl.trans(do))
            causal = i[:, None] >= i[None, :]
            e = tl.where(causal, tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
            dpe = dp * e * scale
            kc = load_rows(k_base, t, m, HQK * D, D)
            z = dpe * tl.dot(load_rows(q_base, t, m, HQK * D, D), tl.trans(kc))
            tl.store(dpe_ptr + sqt, dpe.to(dt))
            tl.store(dpe_ptr + BT * BT + sqt, (dpt * decay_t(gam, i) * scale).to(dt))
            # the WY backward: dA = −Tᵀ·dT·Tᵀ on the strict lower triangle (Tᵀ·dT through the
            # scratch), B + Bᵀ
            strict = (i[:, None] > i[None, :]) & m[:, None] & m[None, :]
            tmat = chunk_t(tm_ptr, bh, t, m, T, BT)
            tl.store(tr + sqt, mm(tl.trans(tmat), dtm, PREC_DA))
            tl.debug_barrier()
            da = -mm(tl.load(tr + sqt), tl.trans(tmat), PREC_DA)
            tl.debug_barrier()  # every warp's loads of Tᵀ·dT before B's stores
            dae = tl.where(strict, da * e, 0.0)
            w = dae * tl.dot(kc, tl.trans(kc))
            dbeta += tl.sum(w, axis=1)
            z += w * bt[:, None]
            dgam = tl.sum(z, axis=1) - tl.sum(z, axis=0)
            tl.store(tr + sqt, dae * bt[:, None])  # B, read back with its transpose by each key part
            tl.debug_barrier()  # also orders the dX, dP ⊙ E and dPᵀ ⊙ Eᵀ stores before their loads
            # key parts of HDK columns: dq and dk, with the row sums of X's K·S term and of Kd's
            rr = tl.zeros([BT], dtype=tl.float32)  # dX_i·(K·S)_i
            y = tl.zeros([BT], dtype=tl.float32)
            dgk = tl.zeros([BT], dtype=tl.float32)  # the γ term of dq's state part
            sds = 0.0  # Σ S ⊙ dS'
            for hk0 in range(0, D, HDK):
                kcols = hk0 + tl.arange(0, HDK)
                key_rows = kcols[:, None] * BV + vv[None, :]
                s_h = tl.load(slot + key_rows)  # S rows of these keys, the program's value columns
                dsp_h = tl.load(ds_in + key_rows)
                sds += tl.sum(tl.sum(s_h.to(tl.float32) * dsp_h, axis=1), axis=0)
                q_h = tl.load(q_ptr + b * T * HQK * D + hk * D + t[:, None] * (HQK * D) + kcols[None, :],
                              mask=m[:, None], other=0.0)
                k_h = tl.load(k_ptr + b * T * HQK * D + hk * D + t[:, None] * (HQK * D) + kcols[None, :],
                              mask=m[:, None], other=0.0)
                dos = tl.zeros([BT, HDK], dtype=tl.float32)
                for _r in range(c, c + 1):
                    dos = tl.dot(value_rows(do_ptr, b, h, t, m, vcol, T, HV, D), tl.trans(s_h))
                dgk += scale * eg * tl.sum(dos * q_h.to(tl.float32), axis=1)
                dq = tl.zeros([BT, HDK], dtype=tl.float32)
                for _r in range(c, c + 1):
                    dq = dos * (scale * eg)[:, None] + tl.dot(tl.load(dpe_ptr + sqt), k_h)
                qk_rows = ((b * T + t[:, None]) * HQK + hk) * D + kcols[None, :]
                if CARRY_IN:
                    dq += tl.load(dq32_ptr + qk_rows, mask=m[:, None], other=0.0)
                if CARRY_OUT:
                    tl.store(dq32_ptr + qk_rows, dq, mask=m[:, None])
                else:
                    tl.store(dq_ptr + qk_rows, dq.to(dq_ptr.dtype.element_ty), mask=m[:, None])
                dxs = tl.zeros([BT, HDK], dtype=tl.float32)
                wt = tl.zeros([BT, HDK], dtype=tl.float32)
                for _r in range(c, c + 1):
                    dxs = tl.dot(tl.load(dxs_ptr + rows), tl.trans(s_h))
                    wt = tl.dot(tl.load(slot + D * BV + BT * BV + rows), tl.trans(tl.load(dsb_in + key_rows)))
                k32 = k_h.to(tl.float32)
                rr += tl.sum(k32 * dxs, axis=1)
                y += ekd * tl.sum(k32 * wt, axis=1)
                dkc = tl.zeros([BT, HDK], dtype=tl.float32)
                for _r in range(c, c + 1):
                    dkc = (wt * ekd[:, None] - dxs * bge[:, None]
                           + tl.dot(tl.load(dpe_ptr + BT * BT + sqt), q_h))
                dkc += mm(tl.load(tr + sqt) + tl.load(tr + sqt_t), k32, PREC_DX)  # (B + Bᵀ)·K
                if CARRY_IN:
                    dkc += tl.load(dk32_ptr + qk_rows, mask=m[:, None], other=0.0)
                if CARRY_OUT:
                    tl.store(dk32_ptr + qk_rows, dkc, mask=m[:, None])
                else:
                    tl.store(dk_ptr + qk_rows, dkc.to(dk_ptr.dtype.element_ty), mask=m[:, None])
            dbeta -= eg * rr
            dgam += dgk
            last = tl.minimum(T - 1 - c * BT, BT - 1)
            dgam += tl.where(i == last, tl.sum(tl.where(m, y, 0.0)) + tl.exp(g_last) * sds, 0.0)
            dgam -= y + bge * rr
            dgam = tl.where(m, dgam, 0.0)
            hrow = (b * T + t) * HV + h
            if VCARRY_IN:
                dbeta += tl.load(db32_ptr + hrow, mask=m, other=0.0)
                dgam += tl.load(dg32_ptr + hrow, mask=m, other=0.0)
            if VCARRY_OUT:
                tl.store(db32_ptr + hrow, dbeta, mask=m)
                tl.store(dg32_ptr + hrow, dgam, mask=m)
            else:
                tl.store(dbeta_ptr + hrow, dbeta.to(dbeta_ptr.dtype.element_ty), mask=m)
                dg = tl.cumsum(dgam, axis=0, reverse=True)
                tl.store(dg_ptr + hrow, dg.to(dg_ptr.dtype.element_ty), mask=m)
        tl.debug_barrier()  # every warp's loads of this group before the next group's stores
    if STORE_DH0:  # noqa: SIM102 (a constexpr and a runtime test: two ifs compile on every Triton)
        if seg == 0:
            tl.store(dh0_ptr + bh * D * D + sq_g, tl.load(ds0 + p * D * BV + sq))


def fused_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor,
    tm: torch.Tensor, kept: tuple[torch.Tensor, torch.Tensor | None, int], do: torch.Tensor,
    dht: torch.Tensor | None, scale: float, g_dtype: torch.dtype, *, want_dh0: bool, cfg: KernelConfig,
) -> tuple[torch.Tensor, ...]:
    """dq, dk ([B, T, Hqk, D], summed over each q/k head's value heads), dv, dg, dβ and dh0 (fp32,
    or None) from the fused forward's `kept` (group states, segment maps, chunks per segment)."""
    check_fused(cfg)
    sg, maps, cps = kept
    B, T, Hqk, _ = q.shape
    Hv = v.shape[2]
    R = Hv // Hqk
    nt = num_chunks(T)
    nseg = triton.cdiv(nt, cps)
    kg = cfg.fused_group
    prec = dot_precision(cfg, q.dtype, "vn")
    dend = dht
    if nseg > 1:
        dext = torch.empty(B * Hv, nseg, D, D, device=q.device, dtype=torch.float32)
        mbv = cfg.fused_maps_bv
        _fused_dmaps_kernel[(D // mbv, B * Hv, nseg - 1)](
            q_ptr=q, k_ptr=k, beta_ptr=beta, gamma_ptr=gamma, tm_ptr=tm, do_ptr=do, dext_ptr=dext,
            scale=scale, T=T, NT=nt, CPS=cps, HQK=Hqk, HV=Hv, R=R, PREC=prec, BT=BT, D=D, BV=mbv,
            num_warps=cfg.fused_maps_warps,
        )
        dend = segment_scan(maps, dext, dht, reverse=True, cfg=cfg)
        del dext
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbeta = torch.empty_like(beta)
    dg = torch.empty(B, T, Hv, device=q.device, dtype=g_dtype)
    dh0 = torch.empty(B, Hv, D, D, device=q.device, dtype=torch.float32) if want_dh0 else None
    bv = cfg.fused_bwd_bv
    nv = D // bv
    dq32 = dk32 = db32 = dg32 = None
    if R * nv > 1:
        dq32 = torch.empty(B, T, Hqk, D, device=q.device, dtype=torch.float32)
        dk32 = torch.empty_like(dq32)
    if nv > 1:
        db32 = torch.empty(B, T, Hv, device=q.device, dtype=torch.float32)
        dg32 = torch.empty_like(db32)
    scr = torch.empty(B * Hqk * nseg, kg * (D * bv + 2 * BT * bv) + 2 * D * bv + BT * bv + 2 * BT * BT,
                      device=q.device, dtype=q.dtype)
    scr32 = torch.empty(B * Hqk * nseg, 3 * D * bv + BT * BT, device=q.device, dtype=torch.float32)
    hdv, hdk = fused_bwd_parts(cfg)
    launches = [(r, iv) for r in range(R) for iv in range(nv)]  # the fixed order of the sums
    for n, (r, iv) in enumerate(launches):
        _fused_bwd_kernel[(B * Hqk, nseg)](
            q_ptr=q, k_ptr=k, v_ptr=v, beta_ptr=beta, gamma_ptr=gamma, tm_ptr=tm, sg_ptr=sg, do_ptr=do,
            dend_ptr=dend if dend is not None else dq, dq_ptr=dq, dk_ptr=dk, dv_ptr=dv, dbeta_ptr=dbeta,
            dg_ptr=dg, dh0_ptr=dh0 if dh0 is not None else dq, dq32_ptr=dq32 if dq32 is not None else dq,
            dk32_ptr=dk32 if dk32 is not None else dq, db32_ptr=db32 if db32 is not None else dq,
            dg32_ptr=dg32 if dg32 is not None else dq, scr_ptr=scr, scr32_ptr=scr32, scale=scale,
            T=T, NT=nt, NG=sg.shape[1], CPS=cps, r=r, iv=iv, HQK=Hqk, HV=Hv, R=R, HAS_DEND=dend is not None,
            STORE_DH0=want_dh0, CARRY_IN=n > 0, CARRY_OUT=n < len(launches) - 1, VCARRY_IN=iv > 0,
            VCARRY_OUT=iv < nv - 1, PREC=prec,
            PREC_DT=dot_precision(cfg, q.dtype, "wy_dt"), PREC_DA=dot_precision(cfg, q.dtype, "wy_da"),
            PREC_DX=dot_precision(cfg, q.dtype, "wy_dx"), BT=BT, D=D, BV=bv, KG=kg, HDV=hdv, HDK=hdk,
            num_warps=cfg.fused_bwd_warps, num_stages=cfg.fused_bwd_stages,
        )
    return dq, dk, dv, dg, dbeta, dh0
