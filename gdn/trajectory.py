"""Optimizer trajectories: a candidate network against the single-device eager reference (§2, §6).

Both sides start from the same seeded weights, read the same token windows (same padding, same
global valid-label count), start AdamW from the same (empty) state with a non-zero learning rate,
and do forward, backward and an optimizer step per step. Each step records the loss and the
global gradient norm; the errors against the reference are kept per step, and max abs and max rel
are tracked independently (they may come from different steps). A NaN/Inf on either side stops
the run with `NonFiniteTrajectory` naming the side and step.

The reference runs on CP rank 0 only (one device, no CP, eager backend) and its records are
broadcast; the candidate runs on every rank of the CP group (a CP mode, a backend, FSDP over the
group or replicated parameters, activation checkpoint off/full). Precision: fp32, or bf16 via
autocast over fp32 master weights on both sides (the same numerics path for both).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gdn import device as devices
from gdn.data import TokenBatch, TokenStream
from gdn.model import HybridModel, build_model, model_config
from gdn.parallel import (
    apply_activation_checkpoint,
    apply_fsdp,
    cp_device_mesh,
    global_grad_norm,
    make_cp,
    named_full_parameters,
    sync_replicated_grads,
)

PROGRESS_EVERY = 25

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class NonFiniteTrajectory(RuntimeError):
    """A loss or gradient norm became NaN/Inf; the message names the side and the step."""


@dataclass(frozen=True)
class TrajectoryConfig:
    """One trajectory case. `valid_lengths` (per batch row) gives tail padding; None = none."""

    model: str = "tiny"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    steps: int = 20
    lr: float = 1e-3
    weight_decay: float = 0.1
    seq_len: int = 128
    batch_size: int = 1
    valid_lengths: tuple[int, ...] | None = None
    dtype: str = "float32"
    seed: int = 0
    reference_backend: str = "eager"
    backend: str = "eager"
    cp_mode: str = "p2p"
    fsdp: bool = True
    checkpoint: str = "off"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported; expected one of {sorted(DTYPES)}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0 (a zero learning rate tests nothing), got {self.lr}")

    def model_cfg(self):  # -> ModelConfig
        return model_config(self.model, **self.model_overrides)


@dataclass(frozen=True)
class StepRecord:
    loss: float
    grad_norm: float


@dataclass
class TrajectoryComparison:
    reference: list[StepRecord]
    candidate: list[StepRecord]

    def errors(self, what: str) -> tuple[list[float], list[float]]:
        """Per-step (abs, rel) errors of `what` ("loss" or "grad_norm") against the reference."""
        abs_err, rel_err = [], []
        for r, c in zip(self.reference, self.candidate, strict=True):
            a, b = getattr(c, what), getattr(r, what)
            abs_err.append(abs(a - b))
            rel_err.append(abs(a - b) / abs(b) if b != 0 else (0.0 if a == b else math.inf))
        return abs_err, rel_err

    def max_abs(self, what: str) -> float:
        return max(self.errors(what)[0])

    def max_rel(self, what: str) -> float:
        return max(self.errors(what)[1])


def autocast_context(device_kind: str, dtype: str) -> contextlib.AbstractContextManager[Any]:
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_kind, dtype=DTYPES[dtype])


def make_optimizer(model: torch.nn.Module, cfg: TrajectoryConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=cfg.weight_decay
    )


@dataclass
class Trainer:
    """One side of a trajectory: model, optimizer, stream, and how gradients meet over CP."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    stream: TokenStream
    device: torch.device
    dtype: str
    group: dist.ProcessGroup | None  # CP group (None: no CP)
    replicated_cp: bool  # CP without FSDP: gradients need a sum over the group
    padded: bool

    def batch(self, step: int) -> TokenBatch:
        return self.stream.batch(step).to(self.device)

    def forward_loss(self, b: TokenBatch) -> torch.Tensor:
        """This rank's share of the global mean loss (the sum over ranks is the loss)."""
        with autocast_context(self.device.type, self.dtype):
            mask = b.mask if self.padded else None
            logits = self.model(b.input_ids, mask, position_offset=b.position_offset)
        return HybridModel.loss(logits, b.labels, b.num_valid)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        if self.replicated_cp:
            sync_replicated_grads(self.model, self.group)

    def global_loss(self, loss: torch.Tensor) -> float:
        value = loss.detach().double()
        if self.group is not None:
            value = value.to(_collective_device(self.device))
            dist.all_reduce(value, group=self.group)
        return float(value)

    def grad_norm(self) -> float:
        sharded = self.group is not None and not self.replicated_cp
        return global_grad_norm(self.model, self.group, sharded=sharded)

    def step(self, step: int, side: str) -> StepRecord:
        """zero_grad + forward + loss + backward (+ FSDP reduce) + record + AdamW.step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_loss(self.batch(step))
        self.backward(loss)
        rec = StepRecord(self.global_loss(loss), self.grad_norm())
        if not (math.isfinite(rec.loss) and math.isfinite(rec.grad_norm)):
            raise NonFiniteTrajectory(
                f"{side} step {step}: loss={rec.loss}, grad_norm={rec.grad_norm} (expected finite values)"
            )
        self.optimizer.step()
        return rec


def _collective_device(device: torch.device) -> torch.device:
    return torch.device("cpu") if device.type == "cpu" else device


def reference_trainer(cfg: TrajectoryConfig, token_file: str | Path, device: torch.device) -> Trainer:
    """One device, no CP, the reference backend, the full sequence."""
    mcfg = cfg.model_cfg()
    model = build_model(mcfg, backend=cfg.reference_backend, seed=cfg.seed, device=device)
    stream = TokenStream(
        token_file, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
        valid_lengths=cfg.valid_lengths, model_vocab_size=mcfg.vocab_size,
    )  # fmt: skip
    return Trainer(model, make_optimizer(model, cfg), stream, device, cfg.dtype, None, False,
                   cfg.valid_lengths is not None)  # fmt: skip


def candidate_trainer(
    cfg: TrajectoryConfig,
    token_file: str | Path,
    device: torch.device,
    group: dist.ProcessGroup | None,
    *,
    checkpoint: str | None = None,
) -> Trainer:
    """The candidate on this rank: a CP mode over `group`, FSDP over the same group (or replicated
    parameters), activation checkpoint per layer."""
    mcfg = cfg.model_cfg()
    distributed = cfg.cp_mode != "none" and dist.is_initialized()
    cp = make_cp(cfg.cp_mode, group) if distributed else None
    rank = dist.get_rank(group) if distributed else 0
    size = dist.get_world_size(group) if distributed else 1
    model = build_model(mcfg, backend=cfg.backend, cp=cp, seed=cfg.seed, device=device)
    apply_activation_checkpoint(model, cfg.checkpoint if checkpoint is None else checkpoint)
    if distributed and cfg.fsdp:
        apply_fsdp(model, cp_device_mesh(group, device.type))
    stream = TokenStream(
        token_file, seq_len=cfg.seq_len, batch_size=cfg.batch_size, cp_rank=rank, cp_size=size,
        valid_lengths=cfg.valid_lengths, model_vocab_size=mcfg.vocab_size,
    )  # fmt: skip
    cp_group = (group if group is not None else dist.group.WORLD) if distributed else None
    return Trainer(model, make_optimizer(model, cfg), stream, device, cfg.dtype, cp_group,
                   distributed and not cfg.fsdp, cfg.valid_lengths is not None)  # fmt: skip


def run_steps(
    trainer: Trainer, steps: int, side: str, on_step: Callable[[int, StepRecord], None] | None = None
) -> list[StepRecord]:
    """`steps` training steps; a line on stderr every `PROGRESS_EVERY` steps (a GPU run of the eager
    reference takes minutes)."""
    records = []
    t0 = time.monotonic()
    for s in range(steps):
        rec = trainer.step(s, side)
        records.append(rec)
        if on_step is not None:
            on_step(s, rec)
        if (s + 1) % PROGRESS_EVERY == 0 and s + 1 < steps:
            print(f"{side}: step {s + 1}/{steps}, {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    return records


# The reference depends only on the model, data, optimizer and precision, not on the candidate's
# CP mode, backend, FSDP or checkpointing: cases that differ only there reuse it (the eager
# reference is the expensive side of a GPU run).
_REFERENCE_CACHE: dict[str, list[StepRecord]] = {}
_REFERENCE_CACHE_SIZE = 4


def _reference_key(cfg: TrajectoryConfig, token_file: str | Path, device: torch.device) -> str:
    fields = asdict(replace(cfg, backend="-", cp_mode="-", fsdp=False, checkpoint="-"))
    path = Path(token_file)
    stat = path.stat()
    blob = {"cfg": fields, "file": str(path.resolve()), "size": stat.st_size, "mtime": stat.st_mtime_ns,
            "device": str(device), "deterministic": torch.are_deterministic_algorithms_enabled()}  # fmt: skip
    return json.dumps(blob, sort_keys=True, default=str)


def run_reference(
    cfg: TrajectoryConfig, token_file: str | Path, device: torch.device, *, cache: bool = True
) -> list[StepRecord]:
    key = _reference_key(cfg, token_file, device)
    if cache and key in _REFERENCE_CACHE:
        return list(_REFERENCE_CACHE[key])
    trainer = reference_trainer(cfg, token_file, device)
    try:
        records = run_steps(trainer, cfg.steps, "reference")
    finally:
        del trainer
        devices.empty_cache(device)
    if cache:
        while len(_REFERENCE_CACHE) >= _REFERENCE_CACHE_SIZE:
            _REFERENCE_CACHE.pop(next(iter(_REFERENCE_CACHE)))
        _REFERENCE_CACHE[key] = list(records)
    return records


def run_trajectory(
    cfg: TrajectoryConfig,
    token_file: str | Path,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> TrajectoryComparison:
    """Reference on CP rank 0 (broadcast to the group), candidate on every rank; call on every rank."""
    distributed = dist.is_initialized() and cfg.cp_mode != "none"
    rank = dist.get_rank(group) if distributed else 0
    payload: list[Any] = [None]
    if rank == 0:
        try:
            payload[0] = ("ok", run_reference(cfg, token_file, device))
        except Exception as exc:  # the other ranks must learn of it, not wait in the broadcast
            if not distributed:
                raise
            payload[0] = ("error", (type(exc).__name__, str(exc)))
    if distributed:
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(payload, src=src, group=group)
    status, value = payload[0]
    if status == "error":
        kind, message = value
        if kind == NonFiniteTrajectory.__name__:
            raise NonFiniteTrajectory(message)
        raise RuntimeError(f"the reference failed on CP rank 0 with {kind}: {message}")
    candidate = run_steps(candidate_trainer(cfg, token_file, device, group), cfg.steps, "candidate")
    return TrajectoryComparison(value, candidate)


@dataclass
class DeterminismResult:
    """Checkpoint off vs full under deterministic mode: bitwise comparisons."""

    off: list[StepRecord]
    full: list[StepRecord]
    params_identical: bool
    max_param_diff: float

    @property
    def losses_identical(self) -> bool:
        return [r.loss for r in self.off] == [r.loss for r in self.full]

    @property
    def grad_norms_identical(self) -> bool:
        return [r.grad_norm for r in self.off] == [r.grad_norm for r in self.full]


def run_determinism_pair(
    cfg: TrajectoryConfig,
    token_file: str | Path,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> DeterminismResult:
    """Train the candidate twice from the same start (checkpoint off, then full); the caller
    enables deterministic mode (`gdn.device.set_deterministic`) first."""
    runs, finals = [], []
    for mode in ("off", "full"):
        trainer = candidate_trainer(cfg, token_file, device, group, checkpoint=mode)
        runs.append(run_steps(trainer, cfg.steps, f"checkpoint={mode}"))
        finals.append(dict(named_full_parameters(trainer.model)))
        del trainer
    a, b = finals
    if a.keys() != b.keys():
        raise RuntimeError(
            f"parameter names differ between checkpoint off and full: {sorted(a.keys() ^ b.keys())}"
        )
    identical = all(torch.equal(a[n], b[n]) for n in a)
    max_diff = max(float((a[n].double() - b[n].double()).abs().max()) for n in a)
    return DeterminismResult(runs[0], runs[1], identical, max_diff)
