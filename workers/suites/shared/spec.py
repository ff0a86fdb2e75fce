"""What the suites' specs share, torch-free: the report's shapes, and the CP modes, precisions and
model/data/FSDP parameters of the model-level suites (`network`, `stability`, `profile`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from workers.suite import DType, Positive, SuiteParams

# The report's production shapes: the GDN head dim and value heads, and the global sequence lengths
# the core is measured at (cp-layer adds 128K).
HEAD_DIM = 128
V_HEADS = 32
REPORT_SEQ_LENS = (8192, 16384, 32768, 65536)
# The chunk length of the Triton kernels (and of the chunked eager backend by default).
CHUNK = 64
# Packed batches (sequence lengths, B = 1, `cu_seqlens`): 8 sequences of mixed lengths (1, 63, 64,
# 65: boundaries inside, on and across a chunk) summing to 16K / 64K.
PACKED_16K = (1, 63, 64, 65, 1000, 3000, 4096, 8095)
PACKED_64K = (4096, 12288, 1, 65, 8192, 16384, 20000, 4510)

# The model-level suites' CP modes ("none": the network on each rank without CP) and precisions.
CP_MODES = ("none", "ulysses", "p2p", "all_gather")
PRECISION = {"float32": "fp32", "bfloat16": "bf16"}
# Fields of the named model (gdn.model.ModelConfig) a job may change: a tiny model with 8 GDN heads
# lets Ulysses split them over 4 or 8 CPU ranks.
ModelOverrideKey = Literal[
    "linear_num_qk_heads", "linear_num_v_heads", "linear_head_dim", "num_layers", "hidden_size",
    "intermediate_size", "num_attention_heads", "num_kv_heads", "attn_head_dim",
]
ModelOverrides = dict[ModelOverrideKey, Positive]


class ModelParams(SuiteParams):
    """The model, data and FSDP parameters of a model-level suite's job: its suite adds its own
    and may change a default (pydantic keeps these fields first, in this order)."""

    model: str = "tiny"  # a name in gdn.model.MODEL_CONFIGS
    model_overrides: ModelOverrides = Field(
        default_factory=dict, description="fields of the named model to change, e.g. its GDN head counts"
    )
    seq_len: Positive = 128  # global sequence length (split over the CP ranks)
    batch_size: Positive = 1
    valid_lengths: tuple[int, ...] | None = None  # tail padding per batch row; None = none
    dtype: DType = "float32"  # float32 | bfloat16 (autocast over fp32 master weights)
    backend: str = "eager"  # the candidate's backend
    modes: tuple[str, ...] = ("ulysses", "p2p", "all_gather")  # CP modes, one case (or more) each
    fsdp: bool = True  # FSDP over the CP group (else replicated parameters)
    seed: int = 0
    token_file: str | None = None
    corpus: str = "sample"  # without token_file: a gdn.data.CORPORA name ("sample", "package", "stdlib")


def case_base(params: ModelParams, exclude: set[str]) -> dict[str, Any]:
    """A case's parameters from the job's: `exclude` dropped, and `model_overrides` only when it
    changes the model, so the cases of a job that sets none keep the fingerprints they had."""
    base = params.model_dump(exclude=exclude)
    if not base.get("model_overrides"):
        base.pop("model_overrides", None)
    return base


def check_modes_and_dtype(
    modes: tuple[str, ...], allowed: tuple[str, ...], dtype: str, what: str = "CP mode"
) -> None:
    """The checks every model-level suite makes of its parameters, naming the valid choices."""
    bad = sorted(set(modes) - set(allowed))
    if bad:
        raise ValueError(f"unknown {what}(s) {bad}; expected a subset of {allowed}")
    if dtype not in PRECISION:
        raise ValueError(f"dtype {dtype!r} is not supported; expected one of {sorted(PRECISION)}")
