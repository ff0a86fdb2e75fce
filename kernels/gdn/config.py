"""Shared constants and the launch settings of the GDN kernels (one place for every stage).

`KernelConfig` is immutable: `gated_delta_rule_triton` resolves one per call from the input dtype
(`kernel_config`) and passes it down to every launch; the backward reuses the forward's.
`config_overrides(**fields)` changes fields for the calls made inside it (benchmark sweeps, tests):
the forward reads it once, so a backward run later (or on autograd's device thread) sees the
same config as its forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

import torch
import triton

BT = 64  # chunk size
D = 128  # head dim (dk = dv)
# The narrowest part of the fused backward's step, in value and in key columns (`fused_bwd_parts`).
# On sm_90 at 8 warps 64-column parts compile to wgmma instructions of n = 32 and 64; 32- and
# 16-column value parts (n down to 16 and 8) ended in an illegal memory access on the H100 with
# Triton 3.6, no index of ours out of bounds (tests/kernels/test_kernels_compile.py checks n >= 32).
FUSED_BWD_MIN_PART = 64


@dataclass(frozen=True)
class KernelConfig:
    """Launch settings, measured on an H200 (docs/kernels.md); benchmarks/profile_gdn_stages.py
    sweeps them."""

    # Dots on fp32 operands for half-precision inputs ("tf32" | "tf32x3" | "ieee" | "hf32": Ascend's
    # counterpart of tf32 | "low": both operands rounded to the input dtype), per group: intra T's
    # block merge (tm) and Wk/U products (wu: T·diag rounded to the input dtype times the exact K
    # or V tile), and in the WY backward the dT sums (wy_dt), dA = -Tᵀ·dT·Tᵀ (wy_da) and the Tᵀ/dA
    # applications that give dk, dv (wy_dx); "" = f32_dot. H200, 16K/64K: the three WY groups
    # "low" cut fwd+bwd from 5.58/21.87 to 4.13/16.05 ms with the worst error 3.27e-3/3.65e-3 ->
    # 3.34e-3/3.66e-3; H200 32K, wu "low" (with intra_wu_bd 128): the intra stage 1.05 -> 0.72 ms,
    # worst error over 3 seeds 3.40e-3 -> 3.55e-3 (docs/kernels.md, "Precision").
    f32_dot: str = "tf32x3"
    f32_dot_tm: str = "tf32"
    f32_dot_wu: str = "low"
    # The intra solve's four 16×16 inverses (product form): tf32x3 on the tensor cores (fp32-level
    # accuracy; 6 barriers instead of 56 at one warp in the sm_90 census) or IEEE fp32 on the CUDA
    # cores. H200 32K: the intra stage 1.093 -> 1.048 ms, worst error unchanged (docs/kernels.md).
    f32_dot_inv: str = "tf32x3"
    f32_dot_wy_dt: str = "low"
    f32_dot_wy_da: str = "low"
    f32_dot_wy_dx: str = "low"
    # The segment scan's products of fp32 maps, for every input dtype (tf32x3: fp32-level accuracy
    # on the tensor cores; IEEE fp32 ones spill 13 KB of stack per program on sm_90).
    f32_dot_scan: str = "tf32x3"
    # The fused path's products with T: Vn = T·X and dX = Tᵀ·dVn (tf32: T and X at about fp16's
    # precision with fp32's range; "low" rounds both to the input dtype).
    f32_dot_vn: str = "tf32"
    # Where the forward walk's Vn comes from: "load": U − Wk·S with Wk and U written by the intra
    # stage; "u": U = (T·diag(β))·V formed in the walk's step at the wu precision (it does not
    # depend on the state), so the intra stage writes Wk alone; "t": Vn = T·(β⊙V − βe^γ⊙(K·S)) at
    # the vn precision, so the forward writes neither (the backward forms Wk for its reverse
    # walk from the kept T). dvl_in_walk: the reverse walk forms the intra-chunk part of dVn
    # (`dvn_local.local_dvn`) from the K, Q and dO tiles it loads anyway, so dvl makes no round
    # trip through memory. walk_wk: the reverse walk forms Wk = (T·diag(βe^γ))·K at the wu
    # precision from the kept T and the K tile it loads anyway, so the forward keeps no Wk and the
    # backward writes none (under walk_vn "t" no Wk exists at all).
    walk_vn: str = "load"
    dvl_in_walk: bool = False
    walk_wk: bool = False
    state_bv: int = 32  # value columns per program of the sequential passes (D/BV programs per head)
    state_warps: int = 4
    state_stages: int = 3  # H200 64K: both passes 5.96 -> 5.46 ms from 2 to 3
    # The intra solve: T's kernel (small tiles in a serial chain) at intra_warps, its K·Kᵀ blocks
    # summed over key slices of intra_bk columns; Wk and U's kernel over intra_wu_bd columns per
    # program (T read once per program; 128: one program per chunk, 0.752 -> 0.720 ms for the
    # intra stage at H200 32K) in products of at most 64 columns, at intra_wu_warps.
    # One warp: the sm_90 census's fewest warp-instructions (6536 per program against 12736 at 4
    # warps), no barriers between warps.
    intra_warps: int = 1
    intra_bk: int = 128
    intra_wu_bd: int = 128
    intra_wu_warps: int = 4
    output_warps: int = 4
    # 128: one program per chunk and value head forms Q·Kᵀ once for all of D's value columns
    # (64: twice, once per half). H100 32K, 32/32: the output stage 0.692 -> 0.632 ms (decision 0020).
    out_bv: int = 128
    dvl_warps: int = 4
    dqk_warps: int = 8
    dqk_bv: int = 64
    dqk_bk: int = 128
    wy_warps: int = 4
    wy_bd: int = 64
    # 1: no software pipelining in bwd_wy. With bf16 products there (f32_dot_wy_* = "low") and
    # Triton's default 3 stages, dbeta and dg differed between identical runs on the H200
    # (Triton 3.6; dk, from the same kernel, did not): K·Kᵀ, their only term not in dk, reads one
    # loaded K tile as both operands of a pipelined product.
    wy_stages: int = 1
    dw_low: bool = True  # bwd_dqk hands dWk to bwd_wy in the input dtype instead of fp32
    # Backward outputs written over the inputs their program alone reads: dVn over dvl, and at
    # one key slice per chunk bwd_dqk's dk partial over dS' and dWk over Vn (`dqk.dqk_buffers`).
    # Off until the GPU tests have run it: the interpreter shows that no program reads what
    # another of its launch writes (the same bits with the programs in reverse order), but it runs
    # a program's warps as one and cannot show an ordering fault between its loads and stores.
    bwd_in_place: bool = False
    # T kept in fp16 instead of fp32 for half-precision inputs: half the bytes, and 3 more mantissa
    # bits than bf16, so Wk/U's products of the scaled T and the WY backward's "low" products
    # keep the accuracy of an fp32 T (|T| stayed <= 1 for unit keys and β in [0, 1] under an
    # adversarial search, <= 2 for β up to 2; docs/kernels.md, "Precision").
    t_fp16: bool = True
    # The fused path (`fused_fwd`, `fused_bwd`): the forward walks each head (fused_bv value
    # columns per program; 128: the whole state) forming Vn = T·(β⊙V − βe^γ⊙(K·S)) on chip, so Wk,
    # U, per-chunk S and Vn are never written; it keeps T and the fp32 state entering every group
    # of fused_group chunks. The backward walks each head with the whole dS on chip, re-walking
    # each group forward from its kept state into a per-program scratch (S, X, Vn of its chunks in
    # the input dtype) and doing the whole WY backward per chunk. Below the multiprocessor count
    # the sequence is cut into segments joined by exact affine maps (`fused_segments`). Off until
    # the device measures it faster than the staged path.
    fused: bool = False
    fused_bv: int = 128
    fused_group: int = 4
    fused_fwd_warps: int = 8
    fused_fwd_stages: int = 1
    fused_bwd_warps: int = 8
    fused_bwd_stages: int = 1
    # Value columns per backward program (128: the whole dS of a head; 64: a [D, 64] slice of it,
    # the slices of a head one launch each, dq, dk, dβ and dg summed over them in fp32 in a fixed
    # order). The step runs D's key columns in fused_bwd_split parts and the program's value
    # columns in parts of the same width, one part when it has no more (`fused_bwd_parts`); no
    # part narrower than FUSED_BWD_MIN_PART.
    fused_bwd_bv: int = 128
    fused_bwd_split: int = 2
    fused_maps_bv: int = 32  # value columns per program of the segment maps (separable columns)
    fused_maps_warps: int = 4
    # Sequence-parallel state passes (state_segments): 0 = choose from the shape, N > 0 = N segments.
    # Dense sequences only: packed ones (varlen) walk one segment per sequence, all in one launch.
    seq_segments: int = 0
    seq_programs_per_sm: int = 2  # the automatic choice: about this many state programs per SM
    seq_min_chunks: int = 8  # and at least this many chunks per segment

    def replace(self, **fields: Any) -> KernelConfig:
        """A copy with `fields` changed; an unknown name is refused with the known ones."""
        known = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(fields) - known)
        if bad:
            raise ValueError(f"unknown KernelConfig field(s) {bad}; expected some of {sorted(known)}")
        return dataclasses.replace(self, **fields)


DEFAULT = KernelConfig()
# fp32 inputs double the bytes of every loaded tile, and the bf16 settings of bwd_dqk then ask for
# more shared memory than Hopper's 232448 B per block (Triton 3.9 for sm_90: 376832 B; the H200
# run with Triton 3.6 raised OutOfResources at 409600 B); the state walks load K and Q straight
# into their products, so 2 stages of fp32 tiles pass the limit in the reverse walk (246276 B).
# tests/kernels/test_kernels_compile.py compiles every launch for sm_90 and checks the limit.
DEFAULT_FP32 = DEFAULT.replace(state_stages=1, dqk_bk=64, dqk_bv=32, dqk_warps=4)
# On an Ascend NPU (torch_npu's "npu" device) triton-ascend's front end refuses tf32 and tf32x3
# ("please use input_precision='hf32' on Ascend"): the intra products take hf32 (its tf32), the
# intra inverses and the segment scan IEEE fp32 (tf32x3 stood for fp32-level accuracy). T stays
# fp32 there: the hf32 Wk/U products would round an fp16 T a second time at the same width.
# tests/kernels/test_kernels_ascend.py lowers every launch with these fields.
NPU_FIELDS = {"f32_dot_tm": "hf32", "f32_dot_wu": "hf32", "f32_dot_inv": "ieee", "f32_dot_scan": "ieee",
              "f32_dot_vn": "hf32", "t_fp16": False}

_OVERRIDES: ContextVar[tuple[tuple[str, Any], ...]] = ContextVar("gdn_kernel_overrides", default=())


def kernel_config(dtype: torch.dtype, device: torch.device | None = None) -> KernelConfig:
    """The config of a call on `dtype` inputs on `device`: that dtype's defaults (with `NPU_FIELDS`
    on an "npu" device) and the fields of the enclosing `config_overrides` applied."""
    base = DEFAULT_FP32 if dtype == torch.float32 else DEFAULT
    if device is not None and torch.device(device).type == "npu":
        base = base.replace(**NPU_FIELDS)
    over = dict(_OVERRIDES.get())
    return base.replace(**over) if over else base


@contextmanager
def config_overrides(**fields: Any) -> Iterator[None]:
    """Calls made inside use these fields on top of their dtype's defaults (nested: inner wins)."""
    token = override_for_run(**fields)
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def override_for_run(**fields: Any) -> Token[tuple[tuple[str, Any], ...]]:
    """A script's --set: these fields on top of the defaults for every later call in this context,
    with no undo (the token is `config_overrides`' undo). Entering `config_overrides` by hand does
    not do this: once its context manager is dropped, the generator is closed and the overrides
    reset."""
    DEFAULT.replace(**fields)  # refuse unknown names here, not at the first launch
    return _OVERRIDES.set((*_OVERRIDES.get(), *fields.items()))


def dot_precision(cfg: KernelConfig, dtype: torch.dtype, group: str) -> str:
    """Precision of one group's dots on fp32 operands: IEEE fp32 for fp32 inputs; for
    half-precision inputs cfg.f32_dot_<group>, else cfg.f32_dot ("tf32" | "tf32x3" | "ieee" |
    "hf32" | "low": both operands rounded to the input dtype, as bf16/fp16 tensor-core products).
    The scan group ("scan") multiplies fp32 maps whatever the inputs: always
    cfg.f32_dot_scan."""
    if dtype == torch.float32 and group != "scan":
        return "ieee"
    prec = str(getattr(cfg, f"f32_dot_{group}") or cfg.f32_dot)
    if prec == "low" and group != "scan":
        return "bf16" if dtype == torch.bfloat16 else "fp16"
    if prec not in ("tf32", "tf32x3", "ieee", "hf32"):
        accepted = ["tf32", "tf32x3", "ieee", "hf32"]
        accepted += ["low"] * (group != "scan")
        raise ValueError(f"f32_dot_{group} = {prec!r}; expected {', '.join(accepted[:-1])} or {accepted[-1]}")
    return prec


def fused_bwd_parts(cfg: KernelConfig) -> tuple[int, int]:
    """The fused backward step's part widths (value columns, key columns): D in fused_bwd_split
    parts, the program's fused_bwd_bv value columns in parts of that width or one part of all of
    them when fewer. Refuses a combination whose part would be narrower than FUSED_BWD_MIN_PART,
    or that does not divide into whole parts."""
    bv, split = cfg.fused_bwd_bv, cfg.fused_bwd_split
    widths = [w for w in (16, 32, 64, 128) if w >= FUSED_BWD_MIN_PART]  # D's power-of-two slices
    splits = sorted(D // w for w in widths)
    if bv not in widths:
        raise ValueError(f"fused_bwd_bv = {bv}: expected {' or '.join(map(str, widths))} (value columns "
                         f"per program; parts narrower than FUSED_BWD_MIN_PART = {FUSED_BWD_MIN_PART} are "
                         "refused)")
    if split not in splits:
        raise ValueError(f"fused_bwd_split = {split}: expected {' or '.join(map(str, splits))} (parts of "
                         f"D = {D}, at least FUSED_BWD_MIN_PART = {FUSED_BWD_MIN_PART} columns each)")
    part = D // split
    return min(bv, part), part


def t_dtype(cfg: KernelConfig, dtype: torch.dtype) -> torch.dtype:
    """The dtype the intra solve keeps T in for inputs of `dtype` (cfg.t_fp16)."""
    return torch.float16 if cfg.t_fp16 and dtype in (torch.bfloat16, torch.float16) else torch.float32


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
