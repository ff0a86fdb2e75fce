"""Device helpers shared by the stage kernels (tile loads, the exact 16×16 inverse, the
global-memory transpose, products at a chosen precision)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_span(c, T, spans_ptr, VARLEN: tl.constexpr, BT: tl.constexpr):
    """First row and end row (exclusive) of chunk c. Dense: c·BT and T (the short last chunk
    masked at T). VARLEN: the chunk table's entry (`chunks.ChunkTable.spans`), so a chunk of packed
    sequences starts where it does in the packed rows and ends at its sequence's end at the latest."""
    if VARLEN:
        t0 = tl.load(spans_ptr + 2 * c)
        t1 = tl.load(spans_ptr + 2 * c + 1)
    else:
        t0 = c * BT
        t1 = T
    return t0, t1


@triton.jit
def walk_range(seq_ptr, spans_ptr, seg, CPS, NT, T, VARLEN: tl.constexpr):
    """Chunks c0 .. c1 and rows r0 .. r1 of state walk `seg`: packed sequence seg (VARLEN; its
    first and end row read from the chunk table once, so the walk steps through its rows by BT
    and its loads stay affine in the loop counter, software-pipelined as the dense walk's are;
    every sequence has a chunk, `kernels.offsets`), else segment seg of CPS chunks of a dense
    sequence of T rows."""
    if VARLEN:
        c0 = tl.load(seq_ptr + seg)
        c1 = tl.load(seq_ptr + seg + 1)
        r0 = tl.load(spans_ptr + 2 * c0)
        r1 = tl.load(spans_ptr + 2 * c1 - 1)
    else:
        c0 = seg * CPS
        c1 = tl.minimum(c0 + CPS, NT)
        r0 = 0
        r1 = T
    return c0, c1, r0, r1


@triton.jit
def state_slot(bh, h, seg, nseg, HV: tl.constexpr, VARLEN: tl.constexpr):
    """Row of walk `seg`'s initial / final state: [N, Hv] per packed sequence (VARLEN), else
    [B·Hv, segments]."""
    if VARLEN:
        st = seg * HV + h
    else:
        st = bh * nseg + seg
    return st


@triton.jit
def walk_span(c, c0, r0, r1, T, VARLEN: tl.constexpr, BT: tl.constexpr):
    """`chunk_span` inside a state walk over chunks c0.. of one sequence at rows r0 .. r1."""
    if VARLEN:
        t0 = r0 + (c - c0) * BT
        t1 = r1
    else:
        t0 = c * BT
        t1 = T
    return t0, t1


@triton.jit
def load_gamma(gamma_ptr, bh, t0, t1, T, BT: tl.constexpr):
    """γ of the chunk at rows t0 .. t1 (t1 - t0 <= BT) with padded rows set to γ_last (so every
    exp(γ_i − γ_j) with j <= i is <= 1), plus γ_last itself and the row mask."""
    t = t0 + tl.arange(0, BT)
    m = t < t1
    last = tl.minimum(t0 + BT - 1, t1 - 1)
    g_last = tl.load(gamma_ptr + bh * T + last)
    gam = tl.load(gamma_ptr + bh * T + t, mask=m, other=0.0)
    return tl.where(m, gam, g_last), g_last, m


@triton.jit
def load_rows(ptr, t, m, row_stride, D: tl.constexpr):
    """A [len(t), D] tile of rows t (masked rows read as 0)."""
    d = tl.arange(0, D)
    return tl.load(ptr + t[:, None] * row_stride + d[None, :], mask=m[:, None], other=0.0)


@triton.jit
def transpose_via(base, x, i, m, row_stride):
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
def mm(a, b, PREC: tl.constexpr):
    """a·b of fp32 tiles at one group's precision: "bf16" / "fp16" round both operands to that type
    (tensor cores, fp32 accumulation); otherwise Triton's input_precision ("tf32", "tf32x3",
    "ieee")."""
    if PREC == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif PREC == "fp16":
        return tl.dot(a.to(tl.float16), b.to(tl.float16))
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def inv_unit_lower16(a, PREC: tl.constexpr = "ieee"):
    """(I + a)⁻¹ for a strictly lower-triangular 16×16 fp32 tile.

    a is nilpotent (a¹⁶ = 0), so (I + a)⁻¹ = Σ_{k<16} (−a)ᵏ = (I − a)(I + a²)(I + a⁴)(I + a⁸):
    six fp32 16×16 products instead of a 16-step substitution whose row extractions are
    cross-thread reductions (measured 4.2 ms for the whole intra stage at 64K on an H200)."""
    r = tl.arange(0, 16)
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    a2 = mm(a, a, PREC)
    a4 = mm(a2, a2, PREC)
    a8 = mm(a4, a4, PREC)
    x = eye - a
    x += mm(x, a2, PREC)
    x += mm(x, a4, PREC)
    x += mm(x, a8, PREC)
    return x


@triton.jit
def state_next(S, vn, kc, gam, g_last):
    """The state leaving a chunk (the forward walk's step): e^{γ_C}·S + Kᵀ·(e^{γ_C−γ} ⊙ Vn).
    The gate scales the [BT, BV] Vn tile rather than the [BT, D] K tile (a quarter of the
    elementwise work at BV = 32, and K enters the product as loaded); Vn·e^{γ_C−γ} (every factor
    <= 1) is rounded to K's dtype, which Wk shares."""
    vg = (vn * tl.exp(g_last - gam)[:, None]).to(kc.dtype)
    return S * tl.exp(g_last) + tl.dot(tl.trans(kc), vg)


@triton.jit
def chunk_t(tm_ptr, bh, t, m, T, BT: tl.constexpr):
    """The chunk's T [BT, BT] (rows t, masked rows 0) in fp32."""
    i = tl.arange(0, BT)
    tmat = tl.load(tm_ptr + (bh * T + t[:, None]) * BT + i[None, :], mask=m[:, None], other=0.0)
    return tmat.to(tl.float32)


@triton.jit
def chunk_beta(beta_ptr, b, h, t, m, T, HV: tl.constexpr):
    """β of rows t of value head h ([B, T, Hv]), fp32, masked rows 0."""
    return tl.load(beta_ptr + (b * T + t) * HV + h, mask=m, other=0.0).to(tl.float32)


@triton.jit
def value_rows(ptr, b, h, t, m, dv, T, HV: tl.constexpr, D: tl.constexpr):
    """Columns dv of rows t of a [B, T, Hv, D] tensor (v, dO), masked rows 0."""
    return tl.load(ptr + ((b * T + t[:, None]) * HV + h) * D + dv[None, :], mask=m[:, None], other=0.0)


@triton.jit
def chunk_vn(tmat, kc, v, bt, gam, Sb, PREC: tl.constexpr):
    """Vn = T·X of a chunk with X = β⊙V − βe^γ⊙(K·S) (`Sb`: the state in the input dtype, `v` its
    value columns); also X, which the backward's dT = dVn·Xᵀ takes. Mathematically U − Wk·S."""
    x = v.to(tl.float32) * bt[:, None] - (bt * tl.exp(gam))[:, None] * tl.dot(kc, Sb)
    return mm(tmat, x, PREC), x
