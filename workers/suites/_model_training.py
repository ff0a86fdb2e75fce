"""What the model-level suites (`network`, `stability`, `profile`) share: their CP modes and
precisions, the parameter checks, the token file, and the candidate trainer of a case. A module
of its own, so no suite imports another suite."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from workers.context import RankContext
from workers.suite import Case, Positive, SuiteParams

CP_MODES = ("none", "ulysses", "p2p", "all_gather")
PRECISION = {"float32": "fp32", "bfloat16": "bf16"}
# Fields of the named model (gdn.model.ModelConfig) a job may change: a tiny model with 8 GDN heads
# lets Ulysses split them over 4 or 8 CPU ranks.
ModelOverrideKey = Literal[
    "linear_num_qk_heads", "linear_num_v_heads", "linear_head_dim", "num_layers", "hidden_size",
    "intermediate_size", "num_attention_heads", "num_kv_heads", "attn_head_dim",
]
MODEL_OVERRIDES_FIELD: Any = Field(
    default_factory=dict, description="fields of the named model to change, e.g. its GDN head counts"
)
ModelOverrides = dict[ModelOverrideKey, Positive]


def case_base(params: SuiteParams, exclude: set[str]) -> dict[str, Any]:
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


_TOKEN_FILES: dict[str, str] = {}


def token_file_for(params: dict[str, Any]) -> str:
    """The case's token file, or one built once per process from a shipped corpus."""
    if params.get("token_file"):
        return str(params["token_file"])
    corpus = params.get("corpus", "sample")
    if corpus not in _TOKEN_FILES:
        import tempfile
        from pathlib import Path

        from gdn.data import build_corpus_token_file

        path = Path(tempfile.mkdtemp(prefix="gdnval-tokens-")) / f"{corpus}.bin"
        build_corpus_token_file(path, corpus)
        _TOKEN_FILES[corpus] = str(path)
    return _TOKEN_FILES[corpus]


def trajectory_config(ctx: RankContext, params: dict[str, Any], **overrides: Any):  # -> TrajectoryConfig
    """TrajectoryConfig of a case; a CP mode needs more than one rank."""
    from workers.harness.trajectory import TrajectoryConfig

    mode = params["mode"]
    if mode != "none" and not ctx.distributed:
        raise ValueError(
            f"CP mode {mode!r} needs a job with world size >= 2 (got {ctx.world_size}); "
            "use mode 'none' on one rank"
        )
    vl = params.get("valid_lengths")
    fields = dict(
        model=params["model"], steps=params.get("steps", 1), lr=params.get("lr", 1e-3),
        seq_len=params["seq_len"], batch_size=params["batch_size"],
        valid_lengths=tuple(vl) if vl else None, dtype=params["dtype"], seed=params.get("seed", 0),
        reference_backend=params.get("reference_backend", "eager"),
        reference_checkpoint=params.get("reference_checkpoint", "off"), backend=params["backend"],
        candidate_chunk_size=params.get("candidate_chunk_size", 64),
        cp_mode=mode, fsdp=params.get("fsdp", True), checkpoint=params.get("checkpoint", "off"),
        model_overrides=dict(params.get("model_overrides") or {}),
    )  # fmt: skip
    fields.update(overrides)
    return TrajectoryConfig(**fields)


def case_trainer(ctx: RankContext, params: dict[str, Any]):  # -> workers.harness.trajectory.Trainer
    """The candidate trainer of a case (speed, stability, profile): its CP group only in a CP mode."""
    from workers.harness.trajectory import candidate_trainer

    cfg = trajectory_config(ctx, params)
    group = ctx.group if cfg.cp_mode != "none" else None
    return candidate_trainer(cfg, token_file_for(params), ctx.device, group)


def ulysses_misfit_of_model(case: Case, world_size: int) -> str | None:
    """A network/stability case in Ulysses mode whose model's GDN heads do not split over the
    ranks: not applicable (gdn.cp.config.ulysses_misfit), never an error."""
    if case.params.get("mode") != "ulysses" or world_size == 1:
        return None
    from gdn.cp.config import ulysses_misfit
    from gdn.model import model_config

    cfg = model_config(case.params["model"], **(case.params.get("model_overrides") or {}))
    return ulysses_misfit(cfg.linear_num_qk_heads, cfg.linear_num_v_heads, world_size)
