"""Chunked gated delta rule in Triton: forward, backward and the CP state summary.

Layout is [B, T, H, D] with D = 128 (dk = dv), chunk 64. q/k have Hqk heads and serve
Hv = r·Hqk value heads natively: value head h reads q/k head h // r (never a materialised repeat).

Per chunk (local cumulative gates γ, incoming state S, C <= 64 rows):
  A  = strict_lower(diag(β)·K·Kᵀ ⊙ e^{γ_i−γ_j}),  T = (I + A)⁻¹
  Wk = T·diag(β·e^γ)·K,  U = T·diag(β)·V                       (intra stage, chunk-parallel)
  Vn = U − Wk·S,  S' = e^{γ_C}·S + (K ⊙ e^{γ_C−γ})ᵀ·Vn            (state stage, sequential in chunks)
  O  = scale·(diag(e^γ)·Q·S + (Q·Kᵀ ⊙ e^{γ_i−γ_j}, j<=i)·Vn)      (output stage, chunk-parallel)

T is built from four 16×16 diagonal inverses (forward substitution in registers) merged by
block products, so the solve is exact up to fp32 rounding rather than a truncated series.

Stages (each a small kernel with one job; `GatedDeltaRuleFunction` only wires them):
  forward : gate cumsum -> intra (T, Wk, U) -> state pass (per-chunk S, Vn, final S) -> output
  backward: local dVn from dO -> reverse state pass (per-chunk dS, full dVn, dh0) ->
            dq/dk/dWk/dγ per chunk -> WY backward (dk, dv, dβ, dγ) and the reverse cumsum to dg.
By default the forward keeps γ, Wk, T, the per-chunk states and Vn for the backward, which drops
each after its last use; TUNING["recompute"] = 1 keeps only γ and recomputes the rest (one more
sequential state pass, less memory between the passes). Under a saved-tensors hook (activation
checkpointing, offloading) it always recomputes: intermediates held on ctx would bypass the hook.

Intermediates (Wk, U, Vn, per-chunk S and dS) are stored in the input dtype; the recurrent state
itself is carried in fp32 registers; T and the gradient accumulators stay fp32. Dots on fp32
operands use IEEE fp32 for fp32 inputs and, for half-precision inputs, the per-group precision of
TUNING["f32_dot*"] (tf32 where the H200 measured no accuracy cost, tf32x3 elsewhere).

CP state summary: `state_summary(k, v, g, beta, initial_state=None, zero_values=False)` runs only
the gate, intra and state stages and writes neither o, nor per-chunk states, nor Vn. The final
state is affine in the initial one, S_end = M·S_in + S_ext, so
  M     = state_summary(k, v, g, beta, initial_state=I, zero_values=True)   (v is not read)
  S_ext = state_summary(k, v, g, beta)                                   (zero initial state)
(the identity is dk×dk and dk = dv = 128). It is forward-only (no autograd).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

BT = 64  # chunk size
D = 128  # head dim (dk = dv)

# Launch settings, measured on an H200 (docs/kernels.md); benchmarks/profile_gdn_stages.py sweeps them.
TUNING: dict[str, int | str] = {
    # Dots on fp32 operands for half-precision inputs ("tf32" | "tf32x3" | "ieee"), per group:
    # intra Wk/U products (wu), and in the WY backward the dT sums (wy_dt), dA = -Tᵀ·dT·Tᵀ (wy_da)
    # and the Tᵀ/dA applications that give dk, dv (wy_dx); "" = f32_dot. All-tf32 put dg and
    # dbeta at 6e-3 on the H200 (bar 5e-3); each of wu, wy_dx, wy_dt alone at tf32 left every
    # tensor's error unchanged, and wu + wy_dx at tf32 cut fwd+bwd at 8K from 3.71 to 2.77 ms
    # (docs/kernels.md, "Precision").
    "f32_dot": "tf32x3",
    "f32_dot_wu": "tf32",
    "f32_dot_wy_dt": "low",
    "f32_dot_wy_da": "low",
    "f32_dot_wy_dx": "low",
    "state_bv": 32,  # value columns per program of the sequential passes (D/BV programs per head)
    "state_warps": 4,
    "state_stages": 3,  # H200 64K: both passes 5.96 -> 5.46 ms from 2 to 3
    "intra_warps": 4,
    "intra_split": 0,
    "wu_warps": 4,
    "output_warps": 4,
    "dvl_warps": 4,
    "dqk_warps": 8,
    "dqk_bv": 64,
    "dqk_bk": 128,
    "wy_warps": 4,
    "wy_bd": 64,
    # 1: no software pipelining in bwd_wy. With bf16 products there (f32_dot_wy_* = "low") and
    # Triton's default 3 stages, dbeta and dg differed between identical runs on the H200
    # (Triton 3.6; dk, from the same kernel, did not): K·Kᵀ, their only term not in dk, reads one
    # loaded K tile as both operands of a pipelined product.
    "wy_stages": 1,
    "out_bv": 64,
    "recompute": 0,  # 1: backward recomputes Wk, T, per-chunk S and Vn instead of saving them
    "dw_low": 1,  # 1: bwd_dqk hands dWk to bwd_wy in the input dtype instead of fp32
    # Sequence-parallel state passes (state_segments): 0 = choose from the shape, N > 0 = N segments.
    "seq_segments": 0,
    "seq_programs_per_sm": 2,  # the automatic choice: about this many state programs per SM
    "seq_min_chunks": 8,  # and at least this many chunks per segment
}

# fp32 inputs double the bytes of every loaded tile, and the bf16 settings of bwd_dqk then ask for
# more shared memory than Hopper's 232448 B per block (Triton 3.9 for sm_90: 376832 B; the H200
# run with Triton 3.6 raised OutOfResources at 409600 B). These entries replace TUNING's for fp32
# inputs only; tests/test_kernels_compile.py compiles every launch for sm_90 and checks the limit.
TUNING_FP32: dict[str, int | str] = {
    "state_stages": 2,  # 3 stages of fp32 tiles would pass the limit in the reverse pass
    "dqk_bk": 64,
    "dqk_bv": 32,
    "dqk_warps": 4,
}


def _tuned(key: str, dtype: torch.dtype) -> int | str:
    """TUNING[key], or TUNING_FP32[key] for fp32 inputs where it has one."""
    if dtype == torch.float32 and key in TUNING_FP32:
        return TUNING_FP32[key]
    return TUNING[key]


def _dot_precision(dtype: torch.dtype, group: str) -> str:
    """Precision of one group's dots on fp32 operands: IEEE fp32 for fp32 inputs; for
    half-precision inputs TUNING["f32_dot_<group>"], else TUNING["f32_dot"] ("tf32" | "tf32x3" |
    "ieee" | "low": both operands rounded to the input dtype, as bf16/fp16 tensor-core products)."""
    if dtype == torch.float32:
        return "ieee"
    prec = str(TUNING[f"f32_dot_{group}"] or TUNING["f32_dot"])
    if prec == "low":
        return "bf16" if dtype == torch.bfloat16 else "fp16"
    if prec not in ("tf32", "tf32x3", "ieee"):
        raise ValueError(f"TUNING f32_dot_{group} = {prec!r}; expected tf32, tf32x3, ieee or low")
    return prec


def _num_chunks(T: int) -> int:
    return triton.cdiv(T, BT)


# ----------------------------------------------------------------------------------------------
# Stage 1: chunk-local cumulative sum of the log gates.
# ----------------------------------------------------------------------------------------------
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
    _gate_cumsum_kernel[(_num_chunks(T), B * H)](g, gamma, T, H, BT)
    return gamma


# ----------------------------------------------------------------------------------------------
# Shared device helpers.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _load_gamma(gamma_ptr, bh, c, T, BT: tl.constexpr):
    """γ of chunk c with padded rows set to γ_last (so every exp(γ_i − γ_j) with j <= i is <= 1),
    plus γ_last itself and the row mask."""
    t = c * BT + tl.arange(0, BT)
    m = t < T
    last = tl.minimum(c * BT + BT - 1, T - 1)
    g_last = tl.load(gamma_ptr + bh * T + last)
    gam = tl.load(gamma_ptr + bh * T + t, mask=m, other=0.0)
    return tl.where(m, gam, g_last), g_last, m


@triton.jit
def _load_rows(ptr, t, m, row_stride, D: tl.constexpr):
    """A [len(t), D] tile of rows t (masked rows read as 0)."""
    d = tl.arange(0, D)
    return tl.load(ptr + t[:, None] * row_stride + d[None, :], mask=m[:, None], other=0.0)


@triton.jit
def _store_rows(ptr, x, t, m, row_stride, D: tl.constexpr):
    d = tl.arange(0, D)
    tl.store(ptr + t[:, None] * row_stride + d[None, :], x.to(ptr.dtype.element_ty), mask=m[:, None])


@triton.jit
def _transpose_via(base, x, i, m, row_stride):
    """xᵀ of a [BT, BT] fp32 tile by a round trip through global memory this program owns and
    has not read yet: rows at `base + r * row_stride` (fp32 units, row_stride >= BT), row r
    valid where m[r]. The barriers order every warp's loads after all stores, and any later
    overwrite of that memory after all loads. Used instead of tl.trans where the tile is a dot
    result that feeds another dot: Triton 3.4-3.7.0 miscompiles that on Hopper (FLA issue 640),
    and the H200 gave run-to-run different dk, dg and dβ."""
    tl.store(base + i[:, None] * row_stride + i[None, :], x, mask=m[:, None])
    tl.debug_barrier()
    xt = tl.load(base + i[None, :] * row_stride + i[:, None], mask=m[None, :], other=0.0)
    tl.debug_barrier()
    return xt


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    """a·b of fp32 tiles at one group's precision: "bf16" / "fp16" round both operands to that type
    (tensor cores, fp32 accumulation), otherwise Triton's input_precision ("tf32", "tf32x3",
    "ieee")."""
    if PREC == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif PREC == "fp16":
        return tl.dot(a.to(tl.float16), b.to(tl.float16))
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _inv_unit_lower16(a):
    """(I + a)⁻¹ for a strictly lower-triangular 16×16 fp32 tile.

    a is nilpotent (a¹⁶ = 0), so (I + a)⁻¹ = Σ_{k<16} (−a)ᵏ = (I − a)(I + a²)(I + a⁴)(I + a⁸):
    six fp32 16×16 products instead of a 16-step substitution whose row extractions are
    cross-thread reductions (measured 4.2 ms for the whole intra stage at 64K on an H200)."""
    r = tl.arange(0, 16)
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    a2 = tl.dot(a, a, input_precision="ieee")
    a4 = tl.dot(a2, a2, input_precision="ieee")
    a8 = tl.dot(a4, a4, input_precision="ieee")
    x = eye - a
    x += tl.dot(x, a2, input_precision="ieee")
    x += tl.dot(x, a4, input_precision="ieee")
    x += tl.dot(x, a8, input_precision="ieee")
    return x


@triton.jit
def _a_block(ki, kj, bi, gi, gj, DIAG: tl.constexpr):
    """16×16 block of A = β_i·(k_i·k_j)·e^{γ_i−γ_j}; strictly lower when DIAG."""
    kk = tl.dot(ki, tl.trans(kj))
    diff = gi[:, None] - gj[None, :]
    if DIAG:
        r = tl.arange(0, 16)
        low = r[:, None] > r[None, :]
        return tl.where(low, bi[:, None] * kk * tl.exp(tl.where(low, diff, 0.0)), 0.0)
    else:
        return bi[:, None] * kk * tl.exp(diff)


# ----------------------------------------------------------------------------------------------
# Stage 2: intra-chunk solve: T = (I + A)⁻¹, Wk = T·(β e^γ K), U = T·(β V).
# ----------------------------------------------------------------------------------------------
@triton.jit
def _lower_block_product(x0, t10, x1, t20, t21, x2, t30, t31, t32, x3, y0, y1, y2, y3, PREC: tl.constexpr):
    """Rows I of T·Y for the 4×4 block lower-triangular T (16-row blocks): Σ_{J<=I} T_IJ·Y_J."""
    r0 = _mm(x0, y0, PREC)
    r1 = _mm(t10, y0, PREC) + _mm(x1, y1, PREC)
    r2 = (
        _mm(t20, y0, PREC)
        + _mm(t21, y1, PREC)
        + _mm(x2, y2, PREC)
    )
    r3 = (
        _mm(t30, y0, PREC)
        + _mm(t31, y1, PREC)
        + _mm(t32, y2, PREC)
        + _mm(x3, y3, PREC)
    )
    return r0, r1, r2, r3


@triton.jit
def _store_row_blocks(base, r0, r1, r2, r3, t0, t1, t2, t3, m0, m1, m2, m3, d, D: tl.constexpr):
    """Store four 16-row blocks of a [T, D] head-major tensor in its element type."""
    ty = base.dtype.element_ty
    tl.store(base + t0[:, None] * D + d[None, :], r0.to(ty), mask=m0[:, None])
    tl.store(base + t1[:, None] * D + d[None, :], r1.to(ty), mask=m1[:, None])
    tl.store(base + t2[:, None] * D + d[None, :], r2.to(ty), mask=m2[:, None])
    tl.store(base + t3[:, None] * D + d[None, :], r3.to(ty), mask=m3[:, None])


@triton.jit
def _intra_kernel(
    k_ptr, v_ptr, beta_ptr, gamma_ptr, w_ptr, u_ptr, tm_ptr,
    T, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    STORE_U: tl.constexpr, STORE_T: tl.constexpr, STORE_WU: tl.constexpr, PREC: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    k_base = k_ptr + b * T * HQK * D + hk * D
    v_base = v_ptr + b * T * HV * D + h * D
    s = tl.arange(0, 16)
    d = tl.arange(0, D)
    last = tl.minimum(c * BT + BT - 1, T - 1)
    g_last = tl.load(gamma_ptr + bh * T + last)

    # Four 16-row sub-blocks of the chunk.
    t0 = c * BT + s
    t1 = t0 + 16
    t2 = t0 + 32
    t3 = t0 + 48
    m0, m1, m2, m3 = t0 < T, t1 < T, t2 < T, t3 < T
    k0 = _load_rows(k_base, t0, m0, HQK * D, D)
    k1 = _load_rows(k_base, t1, m1, HQK * D, D)
    k2 = _load_rows(k_base, t2, m2, HQK * D, D)
    k3 = _load_rows(k_base, t3, m3, HQK * D, D)
    b0 = tl.load(beta_ptr + (b * T + t0) * HV + h, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + (b * T + t1) * HV + h, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(beta_ptr + (b * T + t2) * HV + h, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(beta_ptr + (b * T + t3) * HV + h, mask=m3, other=0.0).to(tl.float32)
    g0 = tl.where(m0, tl.load(gamma_ptr + bh * T + t0, mask=m0, other=0.0), g_last)
    g1 = tl.where(m1, tl.load(gamma_ptr + bh * T + t1, mask=m1, other=0.0), g_last)
    g2 = tl.where(m2, tl.load(gamma_ptr + bh * T + t2, mask=m2, other=0.0), g_last)
    g3 = tl.where(m3, tl.load(gamma_ptr + bh * T + t3, mask=m3, other=0.0), g_last)

    # Diagonal inverses, then the block merge: T_IJ = −X_I·Σ_{J<=L<I} A_IL·T_LJ.
    x0 = _inv_unit_lower16(_a_block(k0, k0, b0, g0, g0, True))
    x1 = _inv_unit_lower16(_a_block(k1, k1, b1, g1, g1, True))
    x2 = _inv_unit_lower16(_a_block(k2, k2, b2, g2, g2, True))
    x3 = _inv_unit_lower16(_a_block(k3, k3, b3, g3, g3, True))
    a10 = _a_block(k1, k0, b1, g1, g0, False)
    a20 = _a_block(k2, k0, b2, g2, g0, False)
    a21 = _a_block(k2, k1, b2, g2, g1, False)
    a30 = _a_block(k3, k0, b3, g3, g0, False)
    a31 = _a_block(k3, k1, b3, g3, g1, False)
    a32 = _a_block(k3, k2, b3, g3, g2, False)
    t10 = -tl.dot(tl.dot(x1, a10, input_precision="ieee"), x0, input_precision="ieee")
    t21 = -tl.dot(tl.dot(x2, a21, input_precision="ieee"), x1, input_precision="ieee")
    t32 = -tl.dot(tl.dot(x3, a32, input_precision="ieee"), x2, input_precision="ieee")
    t20 = -tl.dot(
        x2, tl.dot(a20, x0, input_precision="ieee") + tl.dot(a21, t10, input_precision="ieee"),
        input_precision="ieee",
    )
    t31 = -tl.dot(
        x3, tl.dot(a31, x1, input_precision="ieee") + tl.dot(a32, t21, input_precision="ieee"),
        input_precision="ieee",
    )
    t30 = -tl.dot(
        x3,
        tl.dot(a30, x0, input_precision="ieee")
        + tl.dot(a31, t10, input_precision="ieee")
        + tl.dot(a32, t20, input_precision="ieee"),
        input_precision="ieee",
    )

    if STORE_T:
        # T as [B·Hv, T, 64] fp32 (row = token, column = position in its chunk); zeros above.
        tm_base = tm_ptr + bh * T * BT
        z = tl.zeros([16, 16], dtype=tl.float32)
        tl.store(tm_base + t0[:, None] * BT + s[None, :], x0, mask=m0[:, None])
        tl.store(tm_base + t0[:, None] * BT + 16 + s[None, :], z, mask=m0[:, None])
        tl.store(tm_base + t0[:, None] * BT + 32 + s[None, :], z, mask=m0[:, None])
        tl.store(tm_base + t0[:, None] * BT + 48 + s[None, :], z, mask=m0[:, None])
        tl.store(tm_base + t1[:, None] * BT + s[None, :], t10, mask=m1[:, None])
        tl.store(tm_base + t1[:, None] * BT + 16 + s[None, :], x1, mask=m1[:, None])
        tl.store(tm_base + t1[:, None] * BT + 32 + s[None, :], z, mask=m1[:, None])
        tl.store(tm_base + t1[:, None] * BT + 48 + s[None, :], z, mask=m1[:, None])
        tl.store(tm_base + t2[:, None] * BT + s[None, :], t20, mask=m2[:, None])
        tl.store(tm_base + t2[:, None] * BT + 16 + s[None, :], t21, mask=m2[:, None])
        tl.store(tm_base + t2[:, None] * BT + 32 + s[None, :], x2, mask=m2[:, None])
        tl.store(tm_base + t2[:, None] * BT + 48 + s[None, :], z, mask=m2[:, None])
        tl.store(tm_base + t3[:, None] * BT + s[None, :], t30, mask=m3[:, None])
        tl.store(tm_base + t3[:, None] * BT + 16 + s[None, :], t31, mask=m3[:, None])
        tl.store(tm_base + t3[:, None] * BT + 32 + s[None, :], t32, mask=m3[:, None])
        tl.store(tm_base + t3[:, None] * BT + 48 + s[None, :], x3, mask=m3[:, None])

    if STORE_WU:
        # Wk_I = Σ_J T_IJ·(β e^γ K)_J, in fp32 operands.
        w_base = w_ptr + bh * T * D
        xk0 = k0.to(tl.float32) * (b0 * tl.exp(g0))[:, None]
        xk1 = k1.to(tl.float32) * (b1 * tl.exp(g1))[:, None]
        xk2 = k2.to(tl.float32) * (b2 * tl.exp(g2))[:, None]
        xk3 = k3.to(tl.float32) * (b3 * tl.exp(g3))[:, None]
        w0, w1, w2, w3 = _lower_block_product(
            x0, t10, x1, t20, t21, x2, t30, t31, t32, x3, xk0, xk1, xk2, xk3, PREC
        )
        _store_row_blocks(w_base, w0, w1, w2, w3, t0, t1, t2, t3, m0, m1, m2, m3, d, D)

        if STORE_U:
            u_base = u_ptr + bh * T * D
            xv0 = _load_rows(v_base, t0, m0, HV * D, D).to(tl.float32) * b0[:, None]
            xv1 = _load_rows(v_base, t1, m1, HV * D, D).to(tl.float32) * b1[:, None]
            xv2 = _load_rows(v_base, t2, m2, HV * D, D).to(tl.float32) * b2[:, None]
            xv3 = _load_rows(v_base, t3, m3, HV * D, D).to(tl.float32) * b3[:, None]
            u0, u1, u2, u3 = _lower_block_product(
                x0, t10, x1, t20, t21, x2, t30, t31, t32, x3, xv0, xv1, xv2, xv3, PREC
            )
            _store_row_blocks(u_base, u0, u1, u2, u3, t0, t1, t2, t3, m0, m1, m2, m3, d, D)


@triton.jit
def _wu_kernel(
    k_ptr, v_ptr, beta_ptr, gamma_ptr, tm_ptr, w_ptr, u_ptr,
    T, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, STORE_U: tl.constexpr,
    PREC: tl.constexpr, BT: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Wk = T·(β e^γ K) and U = T·(β V) as two 64-wide products from the stored T."""
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    i = tl.arange(0, BT)
    t = c * BT + i
    m = t < T
    beta = tl.load(beta_ptr + (b * T + t) * HV + h, mask=m, other=0.0).to(tl.float32)
    gam, _, _ = _load_gamma(gamma_ptr, bh, c, T, BT)
    tm = tl.load(tm_ptr + (bh * T + t[:, None]) * BT + i[None, :], mask=m[:, None], other=0.0)
    kc = _load_rows(k_ptr + b * T * HQK * D + hk * D, t, m, HQK * D, D).to(tl.float32)
    w = _mm(tm, kc * (beta * tl.exp(gam))[:, None], PREC)
    _store_rows(w_ptr + bh * T * D, w, t, m, D, D)
    if STORE_U:
        vc = _load_rows(v_ptr + b * T * HV * D + h * D, t, m, HV * D, D).to(tl.float32)
        u = _mm(tm, vc * beta[:, None], PREC)
        _store_rows(u_ptr + bh * T * D, u, t, m, D, D)


def intra_solve(
    k: torch.Tensor,
    v: torch.Tensor | None,
    beta: torch.Tensor,
    gamma: torch.Tensor,
    num_v_heads: int,
    *,
    store_t: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Wk [B·Hv, T, D] and U (None when v is None) in k's dtype, and T [B·Hv, T, 64] fp32 if asked.

    TUNING["intra_split"] = 1 writes T first and forms Wk, U in a second kernel with 64-wide
    products; 0 forms them from the 16×16 blocks in registers (no T round trip)."""
    B, T, Hqk, _ = k.shape
    Hv = num_v_heads
    split = bool(TUNING["intra_split"])
    w = torch.empty(B * Hv, T, D, device=k.device, dtype=k.dtype)
    u = torch.empty_like(w) if v is not None else None
    tm = torch.empty(B * Hv, T, BT, device=k.device, dtype=torch.float32) if (store_t or split) else None
    grid = (_num_chunks(T), B * Hv)
    prec = _dot_precision(k.dtype, "wu")
    _intra_kernel[grid](
        k, v if v is not None else k, beta, gamma, w, u if u is not None else w, tm if tm is not None else w,
        T, Hqk, Hv, Hv // Hqk,
        STORE_U=v is not None, STORE_T=tm is not None, STORE_WU=not split, PREC=prec, BT=BT, D=D,
        num_warps=TUNING["intra_warps"],
    )  # fmt: skip
    if split:
        _wu_kernel[grid](
            k, v if v is not None else k, beta, gamma, tm, w, u if u is not None else w,
            T, Hqk, Hv, Hv // Hqk, STORE_U=v is not None, PREC=prec, BT=BT, D=D,
            num_warps=TUNING["wu_warps"],
        )  # fmt: skip
    return w, u, tm if store_t else None


# ----------------------------------------------------------------------------------------------
# Stage 3: forward state pass (sequential over chunks, parallel over heads and value columns).
# ----------------------------------------------------------------------------------------------
@triton.jit
def _state_fwd_kernel(
    k_ptr, w_ptr, u_ptr, gamma_ptr, h0_ptr, s_ptr, vn_ptr, ht_ptr,
    T, NT, CPS, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    HAS_U: tl.constexpr, HAS_H0: tl.constexpr, STORE_S: tl.constexpr, STORE_VN: tl.constexpr,
    STORE_HT: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """One segment (program_id 2) of CPS chunks: S starts from h0[bh, seg] (or 0) and walks the
    segment's chunks; the last segment writes the final state. One segment = the whole sequence."""
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
    if HAS_H0:
        S = tl.load(h0_ptr + (bh * nseg + seg) * D * D + dk[:, None] * D + dv[None, :]).to(tl.float32)
    else:
        S = tl.zeros([D, BV], dtype=tl.float32)
    c0 = seg * CPS
    c1 = tl.minimum(c0 + CPS, NT)
    for c in range(c0, c1):
        if STORE_S:
            tl.store(s_ptr + (bh * NT + c) * D * D + dk[:, None] * D + dv[None, :], S.to(dt))
        t = c * BT + tl.arange(0, BT)
        m = t < T
        wk = tl.load(w_ptr + (bh * T + t[:, None]) * D + dk[None, :], mask=m[:, None], other=0.0)
        vn = -tl.dot(wk, S.to(dt))
        if HAS_U:
            vn += tl.load(u_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        if STORE_VN:
            tl.store(vn_ptr + (bh * T + t[:, None]) * D + dv[None, :], vn.to(dt), mask=m[:, None])
        gam, g_last, _ = _load_gamma(gamma_ptr, bh, c, T, BT)
        kc = _load_rows(k_base, t, m, HQK * D, D)
        kd = (kc * tl.exp(g_last - gam)[:, None]).to(dt)
        S = S * tl.exp(g_last) + tl.dot(tl.trans(kd), vn.to(dt))
    if STORE_HT:  # noqa: SIM102 - a constexpr guard around a run-time test
        if seg == nseg - 1:
            tl.store(ht_ptr + bh * D * D + dk[:, None] * D + dv[None, :], S)


@triton.jit
def _segment_fwd_summary_kernel(
    k_ptr, w_ptr, u_ptr, gamma_ptr, m_ptr, e_ptr,
    T, NT, CPS, NSEG, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, HAS_U: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """Segment seg's affine map S_out = M·S_in + E (columns dv of both): E from S_in = 0 with U,
    M from S_in = I with V = 0, walked together so each chunk's Wk and K are loaded once.
    Written to m/e [B·Hv, NSEG, D, D] fp32 (the last segment's is never needed)."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    b, h = bh // HV, bh % HV
    hk = h // R
    dk = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    k_base = k_ptr + b * T * HQK * D + hk * D
    dt = w_ptr.dtype.element_ty
    E = tl.zeros([D, BV], dtype=tl.float32)
    M = (dk[:, None] == dv[None, :]).to(tl.float32)
    c0 = seg * CPS
    c1 = tl.minimum(c0 + CPS, NT)
    for c in range(c0, c1):
        t = c * BT + tl.arange(0, BT)
        m = t < T
        wk = tl.load(w_ptr + (bh * T + t[:, None]) * D + dk[None, :], mask=m[:, None], other=0.0)
        ve = -tl.dot(wk, E.to(dt))
        if HAS_U:
            ve += tl.load(u_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        vm = -tl.dot(wk, M.to(dt))
        gam, g_last, _ = _load_gamma(gamma_ptr, bh, c, T, BT)
        kc = _load_rows(k_base, t, m, HQK * D, D)
        kdt = tl.trans((kc * tl.exp(g_last - gam)[:, None]).to(dt))
        decay = tl.exp(g_last)
        E = E * decay + tl.dot(kdt, ve.to(dt))
        M = M * decay + tl.dot(kdt, vm.to(dt))
    off = (bh * NSEG + seg) * D * D + dk[:, None] * D + dv[None, :]
    tl.store(e_ptr + off, E)
    tl.store(m_ptr + off, M)


@triton.jit
def _segment_scan_kernel(
    m_ptr, e_ptr, x0_ptr, xs_ptr, NSEG,
    HAS_X0: tl.constexpr, REVERSE: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """Sequential scan over segments of the affine maps, columns dv of the state.
    Forward (REVERSE = 0): X_0 = x0, X_{j+1} = M_j·X_j + E_j (states entering each segment).
    Reverse (REVERSE = 1): X_{NSEG−1} = x0, X_{j−1} = M_jᵀ·X_j + E_j (state gradients leaving
    each segment; M_j is the forward map, whose transpose carries dS back over segment j).
    Writes every X_j to xs [B·Hv, NSEG, D, D] fp32; tf32x3 products (fp32-level accuracy on the
    tensor cores; IEEE fp32 ones spill 13 KB of stack per program)."""
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
                X = tl.dot(mt, X, input_precision="tf32x3") + tl.load(e_ptr + (bh * NSEG + j) * D * D + cols)
        else:
            if j < NSEG - 1:
                mj = tl.load(m_ptr + (bh * NSEG + j) * D * D + dk[:, None] * D + dk[None, :])
                X = tl.dot(mj, X, input_precision="tf32x3") + tl.load(e_ptr + (bh * NSEG + j) * D * D + cols)


def state_segments(batch_heads: int, T: int, device: torch.device) -> int:
    """How many segments the state passes split the sequence into (1 = one sequential walk).

    TUNING["seq_segments"] > 0 forces it (tests); 0 chooses from the shape: none while one walk
    already has at least half as many programs (B·Hv·D/BV) as the device has multiprocessors,
    else enough segments for about TUNING["seq_programs_per_sm"] programs per multiprocessor,
    each segment at least TUNING["seq_min_chunks"] chunks. CPU tensors (the interpreter) count as one
    multiprocessor, so the automatic choice there is 1."""
    nt = _num_chunks(T)
    forced = int(TUNING["seq_segments"])
    if forced > 0:
        return _even_segments(nt, forced)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    programs = batch_heads * (D // int(TUNING["state_bv"]))
    if 2 * programs > sms:
        # H200: with 128 programs (B·Hv = 32) every split measured slower (16K: 5.11 ms fwd+bwd
        # unsplit, 5.44 with 2 segments, 5.77 with 16); with 32 programs 8 segments cut both
        # passes at 64K from 5.04 to 1.94 ms (docs/kernels.md).
        return 1
    want = int(TUNING["seq_programs_per_sm"]) * sms // programs
    return _even_segments(nt, min(want, nt // int(TUNING["seq_min_chunks"])))


def _even_segments(nt: int, want: int) -> int:
    """The segment count that `want` gives once every segment holds cdiv(nt, want) chunks (none
    left empty)."""
    want = max(1, min(want, nt))
    return triton.cdiv(nt, triton.cdiv(nt, want))


def segment_forward_summary(
    k: torch.Tensor, w: torch.Tensor, u: torch.Tensor | None, gamma: torch.Tensor, num_v_heads: int,
    nseg: int, *, with_last: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment maps (M, E), [B·Hv, nseg, D, D] fp32, of segments 0 .. nseg−2 (u=None: V = 0),
    and of the last segment too when `with_last` (the backward's scan needs M of segments
    1 .. nseg−1; the forward's needs 0 .. nseg−2)."""
    B, T, Hqk, _ = k.shape
    Hv, NT = num_v_heads, _num_chunks(T)
    cps = triton.cdiv(NT, nseg)
    mm = torch.empty(B * Hv, nseg, D, D, device=k.device, dtype=torch.float32)
    ee = torch.empty_like(mm)
    BV = TUNING["state_bv"]
    if nseg > 1:
        _segment_fwd_summary_kernel[(D // BV, B * Hv, nseg if with_last else nseg - 1)](
            k, w, u if u is not None else w, gamma, mm, ee, T, NT, cps, nseg, Hqk, Hv, Hv // Hqk,
            HAS_U=u is not None, BT=BT, D=D, BV=BV,
            num_warps=TUNING["state_warps"], num_stages=_tuned("state_stages", k.dtype),
        )  # fmt: skip
    return mm, ee


def segment_scan(
    mm: torch.Tensor, ee: torch.Tensor, x0: torch.Tensor | None, *, reverse: bool
) -> torch.Tensor:
    """States entering (forward) or state gradients leaving (reverse) every segment."""
    BH, nseg = mm.shape[:2]
    xs = torch.empty_like(mm)
    BV = TUNING["state_bv"]
    _segment_scan_kernel[(D // BV, BH)](
        mm, ee, x0 if x0 is not None else mm, xs, nseg,
        HAS_X0=x0 is not None, REVERSE=reverse, D=D, BV=BV, num_warps=TUNING["state_warps"],
    )  # fmt: skip
    return xs


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
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Per-chunk incoming states [B·Hv, NT, D, D] (k dtype), Vn [B·Hv, T, D], the final fp32 state
    and, when `keep_maps`, the segment transitions M [B·Hv, nseg, D, D] (None for one segment; the
    backward reuses them transposed).

    With nseg = `state_segments(...)` > 1 the sequence is cut into nseg runs of chunks: every
    segment's affine map (M, E) from a zero start in parallel, a scan over segments for the state
    entering each, then every segment's pass from its true state in parallel. Exact: the same
    recurrence, regrouped. u=None means V = 0 (the transition-product run of the CP summary)."""
    B, T, Hqk, _ = k.shape
    Hv, NT = num_v_heads, _num_chunks(T)
    dev = k.device
    s = torch.empty(B * Hv, NT, D, D, device=dev, dtype=k.dtype) if store_states else None
    vn = torch.empty(B * Hv, T, D, device=dev, dtype=k.dtype) if store_vn else None
    ht = torch.empty(B, Hv, D, D, device=dev, dtype=torch.float32) if store_final else None
    BV = TUNING["state_bv"]
    h0 = initial_state.contiguous() if initial_state is not None else None
    nseg = state_segments(B * Hv, T, dev)
    mm = None
    if nseg > 1:
        mm, ee = segment_forward_summary(k, w, u, gamma, Hv, nseg, with_last=keep_maps)
        h0 = segment_scan(mm, ee, h0, reverse=False)
        del ee
        if not keep_maps:
            mm = None
    _state_fwd_kernel[(D // BV, B * Hv, nseg)](
        k, w, u if u is not None else w, gamma, h0 if h0 is not None else w,
        s if s is not None else w, vn if vn is not None else w, ht if ht is not None else w,
        T, NT, triton.cdiv(NT, nseg), Hqk, Hv, Hv // Hqk,
        HAS_U=u is not None, HAS_H0=h0 is not None, STORE_S=store_states, STORE_VN=store_vn,
        STORE_HT=store_final, BT=BT, D=D, BV=BV, num_warps=TUNING["state_warps"],
        num_stages=_tuned("state_stages", k.dtype),
    )  # fmt: skip
    return s, vn, ht, mm


# ----------------------------------------------------------------------------------------------
# Stage 4: output, O = scale·(e^γ·Q·S + (Q·Kᵀ ⊙ E)·Vn), chunk-parallel.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _output_kernel(
    q_ptr, k_ptr, vn_ptr, s_ptr, gamma_ptr, o_ptr, scale,
    T, NT, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, D: tl.constexpr,
    BV: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0)
    iv = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    d = tl.arange(0, D)
    dv = iv * BV + tl.arange(0, BV)
    t = c * BT + tl.arange(0, BT)
    i = tl.arange(0, BT)
    m = t < T
    qk_off = b * T * HQK * D + hk * D
    q = _load_rows(q_ptr + qk_off, t, m, HQK * D, D)
    kc = _load_rows(k_ptr + qk_off, t, m, HQK * D, D)
    S = tl.load(s_ptr + (bh * NT + c) * D * D + d[:, None] * D + dv[None, :])
    vn = tl.load(vn_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
    gam, _, _ = _load_gamma(gamma_ptr, bh, c, T, BT)
    causal = i[:, None] >= i[None, :]
    p = tl.dot(q, tl.trans(kc))
    p = tl.where(causal, p * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
    o = tl.dot(q, S) * tl.exp(gam)[:, None] + tl.dot(p.to(vn.dtype), vn)
    o_off = ((b * T + t[:, None]) * HV + h) * D + dv[None, :]
    tl.store(o_ptr + o_off, (o * scale).to(o_ptr.dtype.element_ty), mask=m[:, None])


def output(
    q: torch.Tensor, k: torch.Tensor, vn: torch.Tensor, s: torch.Tensor, gamma: torch.Tensor,
    num_v_heads: int, scale: float, out_dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """o [B, T, Hv, D] in out_dtype from per-chunk states and Vn."""
    B, T, Hqk, _ = q.shape
    Hv, BV = num_v_heads, TUNING["out_bv"]
    o = torch.empty(B, T, Hv, D, device=q.device, dtype=out_dtype)
    _output_kernel[(_num_chunks(T), D // BV, B * Hv)](
        q, k, vn, s, gamma, o, scale, T, _num_chunks(T), Hqk, Hv, Hv // Hqk, BT=BT, D=D, BV=BV,
        num_warps=TUNING["output_warps"],
    )  # fmt: skip
    return o


# ----------------------------------------------------------------------------------------------
# Backward stage 1: the intra-chunk part of dVn, scale·(K·Qᵀ ⊙ Eᵀ)·dO.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dvn_local_kernel(
    q_ptr, k_ptr, do_ptr, gamma_ptr, dvl_ptr, scale,
    T, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    d = tl.arange(0, D)
    t = c * BT + tl.arange(0, BT)
    i = tl.arange(0, BT)
    m = t < T
    qk_off = b * T * HQK * D + hk * D
    q = _load_rows(q_ptr + qk_off, t, m, HQK * D, D)
    kc = _load_rows(k_ptr + qk_off, t, m, HQK * D, D)
    do = _load_rows(do_ptr + b * T * HV * D + h * D, t, m, HV * D, D)
    gam, _, _ = _load_gamma(gamma_ptr, bh, c, T, BT)
    up = i[:, None] <= i[None, :]  # key i, query j >= i
    pt = tl.dot(kc, tl.trans(q))
    pt = tl.where(up, pt * tl.exp(tl.where(up, gam[None, :] - gam[:, None], 0.0)), 0.0) * scale
    dvl = tl.dot(pt.to(do.dtype), do)
    tl.store(dvl_ptr + (bh * T + t[:, None]) * D + d[None, :], dvl.to(dvl_ptr.dtype.element_ty),
             mask=m[:, None])


# ----------------------------------------------------------------------------------------------
# Backward stage 2: reverse state pass. dS_{c} = e^{γ_C}·dS_{c+1} + scale·(e^γ Q)ᵀ·dO − Wkᵀ·dVn,
# dVn = dVn_local + (K ⊙ e^{γ_C−γ})·dS_{c+1}. Stores dS_{c+1} per chunk and dVn; dh0 = dS_0.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _state_bwd_kernel(
    q_ptr, k_ptr, w_ptr, do_ptr, dvl_ptr, gamma_ptr, dht_ptr, ds_ptr, dvn_ptr, dh0_ptr, scale,
    T, NT, CPS, SEG0, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr,
    HAS_DHT: tl.constexpr, STORE: tl.constexpr, STORE_DH0: tl.constexpr, ALL_DH0: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """Segment seg = SEG0 + program_id 2 of CPS chunks, walked in reverse from dht[bh, seg] (or 0).
    STORE: write dS per chunk and dVn. The segment's start gradient goes to dh0[bh, seg] when
    ALL_DH0 (the summary run of every segment), else segment 0's to dh0[bh] when STORE_DH0."""
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
    if HAS_DHT:
        dS = tl.load(dht_ptr + (bh * nseg + seg) * D * D + cols).to(tl.float32)
    else:
        dS = tl.zeros([D, BV], dtype=tl.float32)
    c0 = seg * CPS
    c1 = tl.minimum(c0 + CPS, NT)
    for j in range(c1 - c0):
        c = c1 - 1 - j
        if STORE:
            tl.store(ds_ptr + (bh * NT + c) * D * D + cols, dS.to(dt))
        t = c * BT + tl.arange(0, BT)
        m = t < T
        gam, g_last, _ = _load_gamma(gamma_ptr, bh, c, T, BT)
        kc = _load_rows(k_ptr + qk_off, t, m, HQK * D, D)
        kd = (kc * tl.exp(g_last - gam)[:, None]).to(dt)
        dvn = tl.dot(kd, dS.to(dt))
        dvn += tl.load(dvl_ptr + (bh * T + t[:, None]) * D + dv[None, :], mask=m[:, None], other=0.0)
        if STORE:
            tl.store(dvn_ptr + (bh * T + t[:, None]) * D + dv[None, :], dvn.to(dt), mask=m[:, None])
        q = _load_rows(q_ptr + qk_off, t, m, HQK * D, D)
        qg = (q * (tl.exp(gam) * scale)[:, None]).to(dt)
        do = tl.load(do_ptr + ((b * T + t[:, None]) * HV + h) * D + dv[None, :], mask=m[:, None], other=0.0)
        wk = tl.load(w_ptr + (bh * T + t[:, None]) * D + dk[None, :], mask=m[:, None], other=0.0)
        dS = dS * tl.exp(g_last) + tl.dot(tl.trans(qg), do.to(dt)) - tl.dot(tl.trans(wk), dvn.to(dt))
    if ALL_DH0:
        tl.store(dh0_ptr + (bh * nseg + seg) * D * D + cols, dS)
    elif STORE_DH0:  # noqa: SIM102 - a constexpr guard around a run-time test
        if seg == 0:
            tl.store(dh0_ptr + bh * D * D + cols, dS)


def dvn_local(
    q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, gamma: torch.Tensor, scale: float
) -> torch.Tensor:
    """The intra-chunk part of dVn, [B·Hv, T, D] in q's dtype."""
    B, T, Hqk, _ = q.shape
    Hv = do.shape[2]
    dvl = torch.empty(B * Hv, T, D, device=q.device, dtype=q.dtype)
    _dvn_local_kernel[(_num_chunks(T), B * Hv)](
        q, k, do, gamma, dvl, scale, T, Hqk, Hv, Hv // Hqk, BT=BT, D=D, num_warps=TUNING["dvl_warps"]
    )
    return dvl


def state_backward(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, do: torch.Tensor, gamma: torch.Tensor,
    dht: torch.Tensor | None, scale: float, *, want_dh0: bool, maps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Per-chunk dS at chunk ends [B·Hv, NT, D, D], full dVn [B·Hv, T, D] and dh0 (fp32) if asked.

    `maps` are the forward's segment transitions (state_forward's fourth result): with them the
    reverse pass is segmented the same way. Every segment but the first walks back from a zero
    gradient (its affine part), a reverse scan carries dS over segments with Mᵀ, then every
    segment walks back from its true gradient in parallel."""
    B, T, Hqk, _ = q.shape
    Hv, NT = do.shape[2], _num_chunks(T)
    R = Hv // Hqk
    dvl = dvn_local(q, k, do, gamma, scale)
    ds = torch.empty(B * Hv, NT, D, D, device=q.device, dtype=q.dtype)
    dvn = torch.empty_like(dvl)
    dh0 = torch.empty(B, Hv, D, D, device=q.device, dtype=torch.float32) if want_dh0 else None
    BV = TUNING["state_bv"]
    nseg = 1 if maps is None else maps.shape[1]
    cps = triton.cdiv(NT, nseg)
    stages = _tuned("state_stages", q.dtype)
    common = dict(BT=BT, D=D, BV=BV, num_warps=TUNING["state_warps"], num_stages=stages)
    dend = dht
    if nseg > 1:
        dext = torch.empty(B * Hv, nseg, D, D, device=q.device, dtype=torch.float32)
        _state_bwd_kernel[(D // BV, B * Hv, nseg - 1)](
            q, k, w, do, dvl, gamma, w, w, w, dext, scale, T, NT, cps, 1, Hqk, Hv, R,
            HAS_DHT=False, STORE=False, STORE_DH0=False, ALL_DH0=True, **common,
        )  # fmt: skip
        dend = segment_scan(maps, dext, dht, reverse=True)
        del dext
    _state_bwd_kernel[(D // BV, B * Hv, nseg)](
        q, k, w, do, dvl, gamma, dend if dend is not None else w, ds, dvn, dh0 if dh0 is not None else w,
        scale, T, NT, cps, 0, Hqk, Hv, R,
        HAS_DHT=dend is not None, STORE=True, STORE_DH0=want_dh0, ALL_DH0=False, **common,
    )  # fmt: skip
    return ds, dvn, dh0


# ----------------------------------------------------------------------------------------------
# Backward stage 3: per chunk dq, the state/output part of dk, dWk and the γ-gradient part.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _bwd_dqk_kernel(
    q_ptr, k_ptr, vn_ptr, do_ptr, dvn_ptr, s_ptr, ds_ptr, gamma_ptr,
    dq_ptr, dk_ptr, dw_ptr, dgam_ptr, scale,
    T, NT, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, DQ_HEADS: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """Columns [ik·BK, (ik+1)·BK) of dq, dk, dWk for one chunk. Every γ-gradient term is linear in
    the column split, so each program writes its own dγ partial (summed by the WY stage)."""
    c = tl.program_id(0)
    ik = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    dkc = ik * BK + tl.arange(0, BK)
    i = tl.arange(0, BT)
    t = c * BT + i
    m = t < T
    qk_off = b * T * HQK * D + hk * D
    q = tl.load(q_ptr + qk_off + t[:, None] * (HQK * D) + dkc[None, :], mask=m[:, None], other=0.0)
    kc = tl.load(k_ptr + qk_off + t[:, None] * (HQK * D) + dkc[None, :], mask=m[:, None], other=0.0)
    dt = q.dtype
    gam, g_last, _ = _load_gamma(gamma_ptr, bh, c, T, BT)
    dq_acc = tl.zeros([BT, BK], dtype=tl.float32)  # dO·Sᵀ
    dk_acc = tl.zeros([BT, BK], dtype=tl.float32)  # Vn·dS'ᵀ
    dw_acc = tl.zeros([BT, BK], dtype=tl.float32)  # dVn·Sᵀ
    dp = tl.zeros([BT, BT], dtype=tl.float32)  # dO·Vnᵀ
    sds = tl.zeros([BK], dtype=tl.float32)  # row sums of S ⊙ dS'
    s_base = s_ptr + (bh * NT + c) * D * D
    ds_base = ds_ptr + (bh * NT + c) * D * D
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
    causal = i[:, None] >= i[None, :]
    e = tl.where(causal, tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
    dpm = dp * e * scale
    qk = tl.dot(q, tl.trans(kc))  # this program's column share of Q·Kᵀ
    eg = tl.exp(gam)
    ekd = tl.exp(g_last - gam)
    dq = dq_acc * (scale * eg)[:, None] + tl.dot(dpm.to(dt), kc)
    # dpmᵀ through this program's own dk tile (BK >= BT columns; written with dk below)
    dpmt = _transpose_via(dk_ptr + (bh * T + c * BT) * D + ik * BK, dpm, i, m, D)
    dk = dk_acc * ekd[:, None] + tl.dot(dpmt.to(dt), q)
    z = dpm * qk
    y = ekd * tl.sum(kc.to(tl.float32) * dk_acc, axis=1)
    dgam = scale * eg * tl.sum(dq_acc * q.to(tl.float32), axis=1) + tl.sum(z, axis=1) - tl.sum(z, axis=0) - y
    last = tl.minimum(T - 1 - c * BT, BT - 1)
    dgam += tl.where(i == last, tl.sum(tl.where(m, y, 0.0)) + tl.exp(g_last) * tl.sum(sds), 0.0)
    # dq goes straight to [B, T, Hqk, D] when R == 1, else to a per-value-head fp32 buffer.
    if DQ_HEADS == HQK:
        dq_off = ((b * T + t[:, None]) * HQK + hk) * D + dkc[None, :]
    else:
        dq_off = ((b * T + t[:, None]) * HV + h) * D + dkc[None, :]
    tl.store(dq_ptr + dq_off, dq.to(dq_ptr.dtype.element_ty), mask=m[:, None])
    tl.store(dk_ptr + (bh * T + t[:, None]) * D + dkc[None, :], dk, mask=m[:, None])
    dw_off = (bh * T + t[:, None]) * D + dkc[None, :]
    tl.store(dw_ptr + dw_off, (-dw_acc).to(dw_ptr.dtype.element_ty), mask=m[:, None])
    tl.store(dgam_ptr + (ik * (tl.num_programs(2)) + bh) * T + t, dgam, mask=m)


# ----------------------------------------------------------------------------------------------
# Backward stage 4: through the WY representation (T, Wk, U) to dk, dv, dβ, dγ, then dg.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _bwd_wy_kernel(
    k_ptr, v_ptr, beta_ptr, gamma_ptr, tm_ptr, dw_ptr, du_ptr, dkp_ptr, dgam_ptr,
    dk_ptr, dv_ptr, dbeta_ptr, dg_ptr,
    T, HQK: tl.constexpr, HV: tl.constexpr, R: tl.constexpr, DK_HEADS: tl.constexpr,
    DK_ROW_F32: tl.constexpr, PREC_DT: tl.constexpr, PREC_DA: tl.constexpr, PREC_DX: tl.constexpr,
    BT: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, NK: tl.constexpr,
):  # fmt: skip
    """Two passes over D slices keep only 64×BD tiles live: the first builds dT and K·Kᵀ (sums
    over D), the second applies Tᵀ and writes dk, dv slice by slice."""
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HV, bh % HV
    hk = h // R
    i = tl.arange(0, BT)
    t = c * BT + i
    m = t < T
    k_base = k_ptr + b * T * HQK * D + hk * D
    v_base = v_ptr + b * T * HV * D + h * D
    beta = tl.load(beta_ptr + (b * T + t) * HV + h, mask=m, other=0.0).to(tl.float32)
    gam, _, _ = _load_gamma(gamma_ptr, bh, c, T, BT)
    eg = tl.exp(gam)
    bg = beta * eg
    tm = tl.load(tm_ptr + (bh * T + t[:, None]) * BT + i[None, :], mask=m[:, None], other=0.0)
    tmt = tl.trans(tm)
    d_t = tl.zeros([BT, BT], dtype=tl.float32)
    kk = tl.zeros([BT, BT], dtype=tl.float32)
    for s0 in range(0, D, BD):
        d = s0 + tl.arange(0, BD)
        ks = tl.load(k_base + t[:, None] * (HQK * D) + d[None, :], mask=m[:, None], other=0.0)
        vs = tl.load(v_base + t[:, None] * (HV * D) + d[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        dws = tl.load(dw_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0)
        dws = dws.to(tl.float32)
        dus = tl.load(du_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0)
        xk = ks.to(tl.float32) * bg[:, None]
        d_t += _mm(dws, tl.trans(xk), PREC_DT)
        d_t += _mm(dus.to(tl.float32), tl.trans(vs * beta[:, None]), PREC_DT)
        kk += tl.dot(ks, tl.trans(ks))
    # dA = −Tᵀ·dT·Tᵀ on the strict lower triangle; A_ij = β_i (k_i·k_j) e^{γ_i−γ_j}.
    strict = (i[:, None] > i[None, :]) & m[:, None] & m[None, :]
    da = -_mm(_mm(tmt, d_t, PREC_DA), tmt, PREC_DA)
    e = tl.exp(tl.where(strict, gam[:, None] - gam[None, :], 0.0))
    dae = tl.where(strict, da * e, 0.0)
    dbeta = tl.sum(dae * kk, axis=1)
    z = dae * kk * beta[:, None]
    dgam = tl.sum(z, axis=1) - tl.sum(z, axis=0)
    for ik in tl.static_range(NK):
        dgam += tl.load(dgam_ptr + (ik * tl.num_programs(1) + bh) * T + t, mask=m, other=0.0)
    bd = dae * beta[:, None]
    # bdᵀ through this program's dk output rows seen as fp32 (the second pass writes dk there)
    dk_rows = dk_ptr + ((b * T + c * BT) * DK_HEADS + h // (HV // DK_HEADS)) * D
    bdt = _transpose_via(dk_rows.to(tl.pointer_type(tl.float32)), bd, i, m, DK_ROW_F32)
    for s0 in range(0, D, BD):
        d = s0 + tl.arange(0, BD)
        ks = tl.load(k_base + t[:, None] * (HQK * D) + d[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        vs = tl.load(v_base + t[:, None] * (HV * D) + d[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        dws = tl.load(dw_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0)
        dws = dws.to(tl.float32)
        dus = tl.load(du_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0)
        dxk = _mm(tmt, dws, PREC_DX)
        dxv = _mm(tmt, dus.to(tl.float32), PREC_DX)
        dks = tl.load(dkp_ptr + (bh * T + t[:, None]) * D + d[None, :], mask=m[:, None], other=0.0)
        dks += dxk * bg[:, None]
        dks += _mm(bd, ks, PREC_DX) + _mm(bdt, ks, PREC_DX)
        dbeta += tl.sum(dxk * ks, axis=1) * eg + tl.sum(dxv * vs, axis=1)
        dgam += tl.sum(dxk * ks, axis=1) * bg
        if DK_HEADS == HQK:
            tl.store(dk_ptr + ((b * T + t[:, None]) * HQK + hk) * D + d[None, :],
                     dks.to(dk_ptr.dtype.element_ty), mask=m[:, None])  # fmt: skip
        else:
            tl.store(dk_ptr + ((b * T + t[:, None]) * HV + h) * D + d[None, :],
                     dks.to(dk_ptr.dtype.element_ty), mask=m[:, None])  # fmt: skip
        tl.store(dv_ptr + ((b * T + t[:, None]) * HV + h) * D + d[None, :],
                 (dxv * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=m[:, None])  # fmt: skip
    dgam = tl.where(m, dgam, 0.0)
    dg = tl.cumsum(dgam, axis=0, reverse=True)
    tl.store(dbeta_ptr + (b * T + t) * HV + h, dbeta.to(dbeta_ptr.dtype.element_ty), mask=m)
    tl.store(dg_ptr + (b * T + t) * HV + h, dg.to(dg_ptr.dtype.element_ty), mask=m)


def bwd_dqk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, gamma: torch.Tensor, s: torch.Tensor,
    ds: torch.Tensor, vn: torch.Tensor, dvn: torch.Tensor, do: torch.Tensor, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """dq (final when Hv == Hqk, per value head fp32 otherwise), the state/output part of dk
    (fp32, head-major), dWk (fp32) and the dγ partials [D/BK, B·Hv, T]."""
    B, T, Hqk, _ = q.shape
    Hv, NT = num_v_heads, _num_chunks(T)
    R = Hv // Hqk
    dev = q.device
    heads = Hqk if R == 1 else Hv
    dq = torch.empty(B, T, heads, D, device=dev, dtype=q.dtype if R == 1 else torch.float32)
    dkp = torch.empty(B * Hv, T, D, device=dev, dtype=torch.float32)
    low_dw = bool(TUNING["dw_low"]) and q.dtype != torch.float32
    dw = torch.empty_like(dkp, dtype=q.dtype if low_dw else torch.float32)
    BK = _tuned("dqk_bk", q.dtype)
    if BK < BT:
        raise ValueError(f"dqk_bk = {BK}: bwd_dqk transposes a {BT}x{BT} tile in its dk columns, "
                         f"so it needs at least {BT} columns per program")
    dgam = torch.empty(D // BK, B * Hv, T, device=dev, dtype=torch.float32)
    _bwd_dqk_kernel[(NT, D // BK, B * Hv)](
        q, k, vn, do, dvn, s, ds, gamma, dq, dkp, dw, dgam, scale,
        T, NT, Hqk, Hv, R, heads, BT=BT, D=D, BK=BK, BV=_tuned("dqk_bv", q.dtype),
        num_warps=_tuned("dqk_warps", q.dtype),
    )  # fmt: skip
    return dq, dkp, dw, dgam


def bwd_wy(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g_dtype: torch.dtype, gamma: torch.Tensor,
    tm: torch.Tensor, dw: torch.Tensor, dvn: torch.Tensor, dkp: torch.Tensor, dgam: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """dk (per value head fp32 when Hv > Hqk), dv, dβ and dg through the WY representation."""
    B, T, Hqk, _ = k.shape
    Hv, NT = v.shape[2], _num_chunks(T)
    R = Hv // Hqk
    heads = Hqk if R == 1 else Hv
    dk = torch.empty(B, T, heads, D, device=k.device, dtype=k.dtype if R == 1 else torch.float32)
    dv = torch.empty_like(v)
    dbeta = torch.empty_like(beta)
    dg = torch.empty(B, T, Hv, device=k.device, dtype=g_dtype)
    _bwd_wy_kernel[(NT, B * Hv)](
        k, v, beta, gamma, tm, dw, dvn, dkp, dgam, dk, dv, dbeta, dg,
        T, Hqk, Hv, R, heads, dk.stride(1) * dk.element_size() // 4,
        PREC_DT=_dot_precision(k.dtype, "wy_dt"), PREC_DA=_dot_precision(k.dtype, "wy_da"),
        PREC_DX=_dot_precision(k.dtype, "wy_dx"), BT=BT, D=D, BD=TUNING["wy_bd"],
        NK=dgam.shape[0], num_warps=TUNING["wy_warps"], num_stages=TUNING["wy_stages"],
    )  # fmt: skip
    return dk, dv, dbeta, dg


def chunk_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g_dtype: torch.dtype,
    gamma: torch.Tensor, tm: torch.Tensor, s: torch.Tensor, ds: torch.Tensor, vn: torch.Tensor,
    dvn: torch.Tensor, do: torch.Tensor, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """dq, dk, dv, dβ, dg from the stored per-chunk states and their gradients."""
    B, T, Hqk, _ = q.shape
    Hv = v.shape[2]
    R = Hv // Hqk
    dq, dkp, dw, dgam = bwd_dqk(q, k, Hv, gamma, s, ds, vn, dvn, do, scale)
    del s, ds, vn
    dk, dv, dbeta, dg = bwd_wy(k, v, beta, g_dtype, gamma, tm, dw, dvn, dkp, dgam)
    if R > 1:
        dq = dq.view(B, T, Hqk, R, D).sum(3).to(q.dtype)
        dk = dk.view(B, T, Hqk, R, D).sum(3).to(k.dtype)
    return dq, dk, dv, dbeta, dg


# ----------------------------------------------------------------------------------------------
# Wiring.
# ----------------------------------------------------------------------------------------------
StateCallback = Callable[[torch.Tensor], None]


def _saved_tensors_hook_active() -> bool:
    """True inside `torch.autograd.graph.saved_tensors_hooks` (non-reentrant activation
    checkpointing installs one): what the forward keeps must then go through the hook or not at
    all. False when this torch build does not expose the query."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is not None and top(False) is not None


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
    scale: float, initial_state: torch.Tensor | None, output_final_state: bool, keep: bool,
    on_final_state: StateCallback | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:  # fmt: skip
    """o, the final state and, when `keep`, (Wk, T, per-chunk S, Vn) for the backward.
    `on_final_state(ht)` runs as soon as the state pass has the final state, before the output
    stage is launched (a CP chain can send it on while the output is computed)."""
    Hv = v.shape[2]
    w, u, tm = intra_solve(k, v, beta, gamma, Hv, store_t=keep)
    s, vn, ht, maps = state_forward(
        k, w, u, gamma, Hv, initial_state, store_states=True, store_vn=True,
        store_final=output_final_state, keep_maps=keep,
    )
    del u
    if on_final_state is not None and ht is not None:
        on_final_state(ht)
    o = output(q, k, vn, s, gamma, Hv, scale, v.dtype)
    return o, ht, ((w, tm, s, vn, maps) if keep else ())


class GatedDeltaRuleFunction(torch.autograd.Function):
    """Autograd wiring of the stages.

    By default the forward keeps Wk, T, the per-chunk states and Vn for the backward: it writes
    them anyway, and recomputing them costs a second sequential state pass (measured ~2 ms of a
    64K fwd+bwd on an H200). They are held on ctx rather than by save_for_backward so that the
    backward can drop each one as soon as its last stage has run (Wk after the reverse pass, S, dS
    and Vn after bwd_dqk), which lowers the backward's peak. A second backward through the same
    graph (retain_graph) finds them gone and recomputes them. TUNING["recompute"] = 1 keeps only
    the inputs and γ and always recomputes; so does a forward under a saved-tensors hook (an
    activation checkpoint drops the saved tensors and re-runs the forward, but would never see
    what ctx holds)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        scale: float, initial_state: torch.Tensor | None, output_final_state: bool,
        on_final_state: StateCallback | None = None, on_initial_state_grad: StateCallback | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        gamma = gate_cumsum(g)
        keep = not TUNING["recompute"] and not _saved_tensors_hook_active()
        o, ht, kept = _forward(
            q, k, v, gamma, beta, scale, initial_state, output_final_state, keep, on_final_state
        )
        ctx.save_for_backward(q, k, v, beta, gamma, initial_state)
        ctx.kept = list(kept) if keep else None  # intermediates, not inputs or outputs
        ctx.scale = scale
        ctx.g_dtype = g.dtype
        ctx.on_initial_state_grad = on_initial_state_grad
        return o, ht

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, do: torch.Tensor | None, dht: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        q, k, v, beta, gamma, h0 = ctx.saved_tensors
        B, T, Hqk, _ = q.shape
        Hv = v.shape[2]
        R = Hv // Hqk
        do = torch.zeros_like(v) if do is None else do.contiguous().to(v.dtype)
        dht = None if dht is None else dht.contiguous().float()
        kept, ctx.kept = ctx.kept, None
        if kept:
            w, tm, s, vn, maps = kept
            del kept
        else:
            w, u, tm = intra_solve(k, v, beta, gamma, Hv, store_t=True)
            s, vn, _, maps = state_forward(
                k, w, u, gamma, Hv, h0, store_states=True, store_vn=True, store_final=False,
                keep_maps=True,
            )
            del u
        ds, dvn, dh0 = state_backward(
            q, k, w, do, gamma, dht, ctx.scale, want_dh0=h0 is not None, maps=maps
        )
        del w, maps
        if ctx.on_initial_state_grad is not None and dh0 is not None:
            ctx.on_initial_state_grad(dh0)  # before the input-gradient stages are launched
        dq, dkp, dw, dgam = bwd_dqk(q, k, Hv, gamma, s, ds, vn, dvn, do, ctx.scale)
        del s, ds, vn
        dk, dv, dbeta, dg = bwd_wy(k, v, beta, ctx.g_dtype, gamma, tm, dw, dvn, dkp, dgam)
        del tm, dw, dvn, dkp, dgam
        if R > 1:
            dq = dq.view(B, T, Hqk, R, D).sum(3).to(q.dtype)
            dk = dk.view(B, T, Hqk, R, D).sum(3).to(k.dtype)
        if dh0 is not None:
            dh0 = dh0.to(h0.dtype)
        return dq, dk, dv, dg, dbeta, None, dh0, None, None, None


def gated_delta_rule_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    on_final_state: StateCallback | None = None,
    on_initial_state_grad: StateCallback | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule, [B, T, H, 128] layout, grouped heads native; returns (o, final_state | None).

    Inputs are validated by `gdn.ops.gated_delta_rule`; this checks only what the kernels assume.
    The callbacks receive the final state (fp32) as soon as the forward's state pass has it, and
    the initial state's gradient (fp32) as soon as the backward's reverse state pass has it: the
    points a context-parallel state chain waits on, ahead of the stages that follow them.
    """
    if q.shape[-1] != D or v.shape[-1] != D:
        raise ValueError(f"head_dim must be {D}, got q {q.shape[-1]} and v {v.shape[-1]}")
    if v.shape[2] % q.shape[2]:
        raise ValueError(f"Hv={v.shape[2]} is not a multiple of Hqk={q.shape[2]}")
    scale = D**-0.5 if scale is None else float(scale)
    h0 = None if initial_state is None else initial_state.float().contiguous()
    o, ht = GatedDeltaRuleFunction.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
        scale, h0, output_final_state, on_final_state, on_initial_state_grad,
    )  # fmt: skip
    return o, ht


@torch.no_grad()
def state_summary(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    zero_values: bool = False,
) -> torch.Tensor:
    """Final state [B, Hv, 128, 128] fp32 only: no output, no per-chunk states (forward-only).

    zero_values=True runs with V = 0 (v is not read), so with initial_state = I it gives the
    chunk-transition product M of S_end = M·S_in + S_ext; see the module docstring."""
    Hv = v.shape[2]
    k, beta = k.contiguous(), beta.contiguous()
    gamma = gate_cumsum(g.contiguous())
    w, u, _ = intra_solve(k, None if zero_values else v.contiguous(), beta, gamma, Hv)
    h0 = None if initial_state is None else initial_state.float().contiguous()
    _, _, ht, _ = state_forward(
        k, w, u, gamma, Hv, h0, store_states=False, store_vn=False, store_final=True
    )
    return ht
