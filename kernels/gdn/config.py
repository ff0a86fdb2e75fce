"""Shared constants and launch settings of the GDN kernels (one place for every stage).

TUNING holds the launch settings measured on an H200 (docs/kernels.md); benchmarks/profile_gdn_stages.py
sweeps them. TUNING_FP32 replaces a few for fp32 inputs, whose tiles are twice the bytes.
"""

from __future__ import annotations

import torch
import triton

BT = 64  # chunk size
D = 128  # head dim (dk = dv)

# Launch settings, measured on an H200 (docs/kernels.md); benchmarks/profile_gdn_stages.py sweeps them.
TUNING: dict[str, int | str] = {
    # Dots on fp32 operands for half-precision inputs ("tf32" | "tf32x3" | "ieee" | "low": both
    # operands rounded to the input dtype), per group: intra Wk/U products (wu), and in the WY
    # backward the dT sums (wy_dt), dA = -Tᵀ·dT·Tᵀ (wy_da) and the Tᵀ/dA applications that give
    # dk, dv (wy_dx); "" = f32_dot. H200, 16K/64K: the three WY groups "low" cut fwd+bwd from
    # 5.58/21.87 to 4.13/16.05 ms with the worst error 3.27e-3/3.65e-3 -> 3.34e-3/3.66e-3; wu "low"
    # raised o's error 3.08e-3 -> 3.48e-3 for no time (docs/kernels.md, "Precision").
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
    # 1: the backward runs bwd_dqk and bwd_wy as one kernel per chunk and head (dqk_wy), so dWk,
    # the fp32 dk partial and the dγ partials never reach memory; 0: the two stages. Off: slower on
    # the H200 (32K stage 4.01 vs 1.34 + 1.31 ms, it spills; fwd+bwd +19-20% at 16K/64K) for 8%
    # less peak memory (docs/kernels.md, "Fused stages").
    "fused_dqk_wy": 0,
    "dqkwy_bv": 64,  # value columns per step of its S/dS loop
    "dqkwy_warps": 8,
    "dqkwy_stages": 1,  # as bwd_wy (wy_stages): K·Kᵀ from one loaded tile, unpipelined
    # 1: the forward runs the state walk and the output in one kernel per segment (fused_fwd), so
    # the output never reads per-chunk S and Vn back and a forward without a backward never stores
    # them; 0: the separate state pass and output stage. Off: slower on the H200 (32K stage 1.79
    # vs 0.87 + 0.52 ms: the output's products lengthen each step of the sequential walk; fwd+bwd
    # +5-6% at 16K/64K).
    "fused_fwd": 0,
    "fused_bv": 32,  # value columns per program of the fused walk (D/BV programs per head)
    "fused_warps": 4,
    "fused_stages": 3,
    # 1: the state walks load Kd = K ⊙ e^{γ_last − γ} and Qg = scale·Q ⊙ e^γ formed chunk-parallel
    # beforehand (walk_operands) instead of forming them in every sequential step; bit-identical.
    # Off until measured on the H200 (predicted from the sm_90 code of the walk: the steps lose
    # their elementwise pass and register transpose, the op gains one launch per pass and
    # 2 (forward) / 4 (backward) x [B·Hv, T, D] of traffic).
    "walk_operands": 0,
    "ready_stages": 3,  # software-pipelining stages of the walks on operands formed ahead
    "recompute": 0,  # 1: backward recomputes Wk, T, per-chunk S and Vn instead of saving them
    "dw_low": 1,  # 1: bwd_dqk hands dWk to bwd_wy in the input dtype instead of fp32
    # Sequence-parallel state passes (state_segments): 0 = choose from the shape, N > 0 = N segments.
    # Dense sequences only: packed ones (varlen) walk one segment per sequence, all in one launch.
    "seq_segments": 0,
    "seq_programs_per_sm": 2,  # the automatic choice: about this many state programs per SM
    "seq_min_chunks": 8,  # and at least this many chunks per segment
}

# fp32 inputs double the bytes of every loaded tile, and the bf16 settings of bwd_dqk then ask for
# more shared memory than Hopper's 232448 B per block (Triton 3.9 for sm_90: 376832 B; the H200
# run with Triton 3.6 raised OutOfResources at 409600 B). These entries replace TUNING's for fp32
# inputs only; tests/kernels/test_kernels_compile.py compiles every launch for sm_90 and checks the limit.
TUNING_FP32: dict[str, int | str] = {
    "state_stages": 2,  # 3 stages of fp32 tiles would pass the limit in the reverse pass
    "ready_stages": 1,  # the reverse walk on Kd and Qg formed ahead: 245760 B at 2 stages
    "fused_stages": 1,  # the fused walk loads Wk, U, Q and K per chunk: 104 KiB a stage in fp32
    "dqk_bk": 64,
    "dqk_bv": 32,
    "dqk_warps": 4,
    "dqkwy_bv": 32,
}


def tuned(key: str, dtype: torch.dtype) -> int | str:
    """TUNING[key], or TUNING_FP32[key] for fp32 inputs where it has one."""
    if dtype == torch.float32 and key in TUNING_FP32:
        return TUNING_FP32[key]
    return TUNING[key]


def dot_precision(dtype: torch.dtype, group: str) -> str:
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


def num_chunks(T: int, spans: torch.Tensor | None = None) -> int:
    """Chunks of a dense sequence of T rows, or the rows of the chunk table `spans` of packed
    sequences (`chunks.ChunkTable`)."""
    return triton.cdiv(T, BT) if spans is None else spans.shape[0]


def chunk_count(T: int, seq_chunks: torch.Tensor | None, spans: torch.Tensor | None) -> int:
    """`num_chunks` for the state walks, which need both tensors of a chunk table or neither."""
    if (seq_chunks is None) != (spans is None):
        raise ValueError("packed sequences need both seq_chunks and spans (chunks.ChunkTable), "
                         f"got seq_chunks={seq_chunks is not None}, spans={spans is not None}")
    return num_chunks(T, spans)
