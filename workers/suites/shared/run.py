"""What the model-level suites (`network`, `stability`, `profile`) run alike on the ranks: the token
file and the candidate trainer of a case, and the not-applicable rule of Ulysses cases."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gdn.cp.config import ulysses_misfit
from gdn.data import build_corpus_token_file
from gdn.model import model_config
from workers.context import RankContext
from workers.harness.trajectory import Trainer, TrajectoryConfig, candidate_trainer
from workers.suite import Case

_TOKEN_FILES: dict[str, str] = {}


def token_file_for(params: Mapping[str, Any]) -> str:
    """The case's token file, or one built once per process from a shipped corpus."""
    if params.get("token_file"):
        return str(params["token_file"])
    corpus = params.get("corpus", "sample")
    if corpus not in _TOKEN_FILES:
        path = Path(tempfile.mkdtemp(prefix="gdnval-tokens-")) / f"{corpus}.bin"
        build_corpus_token_file(path, corpus)
        _TOKEN_FILES[corpus] = str(path)
    return _TOKEN_FILES[corpus]


def trajectory_config(ctx: RankContext, params: Mapping[str, Any], **overrides: Any) -> TrajectoryConfig:
    """TrajectoryConfig of a case; a CP mode needs more than one rank."""
    mode = params["mode"]
    if mode != "none" and not ctx.distributed:
        raise ValueError(
            f"CP mode {mode!r} needs a job with world size >= 2 (got {ctx.world_size}); "
            "use mode 'none' on one rank"
        )
    vl = params.get("valid_lengths")
    fields: dict[str, Any] = dict(
        model=params["model"], steps=params.get("steps", 1), lr=params.get("lr", 1e-3),
        seq_len=params["seq_len"], batch_size=params["batch_size"],
        valid_lengths=tuple(vl) if vl else None, dtype=params["dtype"], seed=params.get("seed", 0),
        reference_backend=params.get("reference_backend", "eager"),
        reference_checkpoint=params.get("reference_checkpoint", "off"), backend=params["backend"],
        candidate_chunk_size=params.get("candidate_chunk_size", 64),
        cp_mode=mode, fsdp=params.get("fsdp", True), checkpoint=params.get("checkpoint", "off"),
        model_overrides=dict(params.get("model_overrides") or {}),
    )
    fields.update(overrides)
    return TrajectoryConfig(**fields)


def case_trainer(ctx: RankContext, params: Mapping[str, Any]) -> Trainer:
    """The candidate trainer of a case (speed, stability, profile): its CP group only in a CP mode."""
    cfg = trajectory_config(ctx, params)
    group = ctx.group if cfg.cp_mode != "none" else None
    return candidate_trainer(cfg, token_file_for(params), ctx.device, group)


def ulysses_misfit_of_model(case: Case, world_size: int) -> str | None:
    """A network/stability case in Ulysses mode whose model's GDN heads do not split over the
    ranks: not applicable (gdn.cp.config.ulysses_misfit), never an error."""
    if case.params.get("mode") != "ulysses" or world_size == 1:
        return None
    cfg = model_config(case.params["model"], **(case.params.get("model_overrides") or {}))
    return ulysses_misfit(cfg.linear_num_qk_heads, cfg.linear_num_v_heads, world_size)
