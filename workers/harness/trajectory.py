"""Optimizer trajectories: a candidate network against the single-device eager reference.

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

Streaming: `iter_trajectory` yields each step as soon as it exists (the reference steps while
the reference runs on rank 0, or after the broadcast on the other ranks; then each candidate step
with its reference step), so a caller that stops at a deadline keeps what was computed.

Reference file (`reference_file=`): the reference's steps read from, or written to, a small JSON
file keyed by what they depend on (`workers.harness.reference_file` describes the format and
the key); `reference_key` builds the key from the config.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gdn import collectives
from gdn import device as devices
from gdn.data import TokenBatch, TokenStream
from gdn.model import HybridModel, build_model, model_config, set_gdn_chunk_size
from gdn.parallel import (
    apply_activation_checkpoint,
    apply_fsdp,
    cp_device_mesh,
    global_grad_norm,
    make_cp,
    named_full_parameters,
    sync_replicated_grads,
)
from workers.harness.reference_file import (
    REFERENCE_NUMERICS,
    ReferenceFileMismatch,
    StepRecord,
    read_reference_file,
    token_file_digest,
    write_reference_file,
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
    # activation checkpoint of the reference ("off" | "full"): the same numbers (checkpoint off and
    # full are bitwise equal, the determinism pair checks it) in far less memory, which is what lets
    # one device hold the whole sequence of a CP4/CP8 run (64K-128K tokens)
    reference_checkpoint: str = "off"
    backend: str = "eager"
    # the candidate's GDN chunk length: 64 (the kernels'), or another on the eager backend for a
    # candidate that differs from the reference only in rounding (the trajectory's floor)
    candidate_chunk_size: int = 64
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


def step_error(candidate: float, reference: float) -> tuple[float, float]:
    """(abs, rel) error of one value against the reference; rel is inf when only the reference is 0."""
    a, b = candidate, reference
    return abs(a - b), (abs(a - b) / abs(b) if b != 0 else (0.0 if a == b else math.inf))


@dataclass
class TrajectoryComparison:
    reference: list[StepRecord]
    candidate: list[StepRecord]

    def errors(self, what: str) -> tuple[list[float], list[float]]:
        """Per-step (abs, rel) errors of `what` ("loss" or "grad_norm") against the reference."""
        abs_err, rel_err = [], []
        for r, c in zip(self.reference, self.candidate, strict=True):
            a, b = step_error(getattr(c, what), getattr(r, what))
            abs_err.append(a)
            rel_err.append(b)
        return abs_err, rel_err

    def max_abs(self, what: str) -> float:
        return max(self.errors(what)[0])

    def max_rel(self, what: str) -> float:
        return max(self.errors(what)[1])


def autocast_context(device_kind: str, dtype: str) -> contextlib.AbstractContextManager[Any]:
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_kind, dtype=DTYPES[dtype])


ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8


def make_optimizer(model: torch.nn.Module, cfg: TrajectoryConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=cfg.weight_decay
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

    def forward_backward(self, b: TokenBatch) -> torch.Tensor:
        """zero_grad + forward + loss + backward (+ FSDP reduce); returns this rank's loss share."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_loss(b)
        self.backward(loss)
        return loss

    def global_loss(self, loss: torch.Tensor) -> float:
        value = loss.detach().double()
        if self.group is not None:
            value = collectives.sum_over(value.to(_collective_device(self.device)), self.group, "step loss")
        return float(value)

    def grad_norm(self) -> float:
        sharded = self.group is not None and not self.replicated_cp
        return global_grad_norm(self.model, self.group, sharded=sharded)

    def step(self, step: int, side: str) -> StepRecord:
        """`forward_backward` + record + AdamW.step."""
        loss = self.forward_backward(self.batch(step))
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
    apply_activation_checkpoint(model, cfg.reference_checkpoint)
    stream = TokenStream(
        token_file, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
        valid_lengths=cfg.valid_lengths, model_vocab_size=mcfg.vocab_size,
    )
    return Trainer(model, make_optimizer(model, cfg), stream, device, cfg.dtype, None, False,
                   cfg.valid_lengths is not None)


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
    set_gdn_chunk_size(model, cfg.candidate_chunk_size)
    apply_activation_checkpoint(model, cfg.checkpoint if checkpoint is None else checkpoint)
    if distributed and cfg.fsdp:
        apply_fsdp(model, cp_device_mesh(group, device.type))
    stream = TokenStream(
        token_file, seq_len=cfg.seq_len, batch_size=cfg.batch_size, cp_rank=rank, cp_size=size,
        valid_lengths=cfg.valid_lengths, model_vocab_size=mcfg.vocab_size,
    )
    cp_group = (group if group is not None else dist.group.WORLD) if distributed else None
    return Trainer(model, make_optimizer(model, cfg), stream, device, cfg.dtype, cp_group,
                   distributed and not cfg.fsdp, cfg.valid_lengths is not None)


def iter_steps(trainer: Trainer, steps: int, side: str) -> Iterator[StepRecord]:
    """`steps` training steps, each record as soon as its step is done; a line on stderr every
    `PROGRESS_EVERY` steps (a GPU run of the eager reference takes minutes)."""
    t0 = time.monotonic()
    for s in range(steps):
        yield trainer.step(s, side)
        if (s + 1) % PROGRESS_EVERY == 0 and s + 1 < steps:
            print(f"{side}: step {s + 1}/{steps}, {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)


def run_steps(
    trainer: Trainer, steps: int, side: str, on_step: Callable[[int, StepRecord], None] | None = None
) -> list[StepRecord]:
    """`iter_steps` as a list; `on_step(step, record)` after each step."""
    records = []
    for s, rec in enumerate(iter_steps(trainer, steps, side)):
        records.append(rec)
        if on_step is not None:
            on_step(s, rec)
    return records


# ------------------------------------------------------------------------------------------------
# The reference: its key, the in-process cache and the reference file
# ------------------------------------------------------------------------------------------------
# The reference depends only on the model, data, optimizer and precision, not on the candidate's
# CP mode, backend, FSDP or checkpointing: cases that differ only there reuse it (the eager
# reference is the expensive side of a GPU run).
_REFERENCE_CACHE: dict[str, list[StepRecord]] = {}
_REFERENCE_CACHE_SIZE = 4
_NOT_IN_KEY = (
    "backend", "candidate_chunk_size", "cp_mode", "fsdp", "checkpoint", "reference_checkpoint", "steps"
)

def reference_key(cfg: TrajectoryConfig, token_file: str | Path, device: torch.device) -> dict[str, Any]:
    """What the reference trajectory depends on, portable across machines (JSON types only):
    no path, no host, no device index; the step count is left out (a prefix stays valid)."""
    config = {k: v for k, v in asdict(cfg).items() if k not in _NOT_IN_KEY}
    key = {
        "config": config,
        "model": asdict(cfg.model_cfg()),
        "optimizer": {"name": "AdamW", "betas": ADAMW_BETAS, "eps": ADAMW_EPS},
        "data": token_file_digest(token_file),
        "device_kind": devices.kind_of(device),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "numerics": REFERENCE_NUMERICS,
    }
    return json.loads(json.dumps(key, sort_keys=True))  # tuples -> lists, as a file reads back


def iter_reference(
    cfg: TrajectoryConfig,
    token_file: str | Path,
    device: torch.device,
    *,
    cache: bool = True,
    reference_file: str | Path | None = None,
) -> Iterator[tuple[StepRecord, str]]:
    """The reference's records, each as soon as it exists, with where it came from: "file",
    "cache" (this process computed it for an earlier case) or "computed". A computed or cached
    reference is written to `reference_file` when that does not exist yet."""
    key = reference_key(cfg, token_file, device)
    path = Path(reference_file) if reference_file else None
    if path is not None and path.exists():
        records = read_reference_file(path, key, cfg.steps)
        print(f"reference: {len(records)} step(s) read from the reference file {path.resolve()}",
              file=sys.stderr, flush=True)
        for rec in records:
            yield rec, "file"
        return
    mem_key = json.dumps({"key": key, "steps": cfg.steps, "device": str(device)}, sort_keys=True)
    records: list[StepRecord] = []
    if cache and mem_key in _REFERENCE_CACHE:
        records = list(_REFERENCE_CACHE[mem_key])
        if path is not None:
            _write_reference(path, key, records, device, None)
        for rec in records:
            yield rec, "cache"
        return
    t0 = time.monotonic()
    trainer: Trainer | None = reference_trainer(cfg, token_file, device)
    steps = iter_steps(trainer, cfg.steps, "reference")
    try:
        for rec in steps:
            records.append(rec)
            if len(records) == cfg.steps:  # the whole reference exists: keep it before going on
                steps.close()
                del steps
                trainer = None  # free the reference's model and optimizer before the candidate
                devices.empty_cache(device)
                if cache:
                    while len(_REFERENCE_CACHE) >= _REFERENCE_CACHE_SIZE:
                        _REFERENCE_CACHE.pop(next(iter(_REFERENCE_CACHE)))
                    _REFERENCE_CACHE[mem_key] = list(records)
                if path is not None:
                    _write_reference(path, key, records, device, time.monotonic() - t0)
            yield rec, "computed"
    finally:
        if trainer is not None:
            trainer = None
            devices.empty_cache(device)


def _write_reference(
    path: Path, key: dict[str, Any], records: list[StepRecord], device: torch.device, seconds: float | None
) -> None:
    write_reference_file(path, key, records, device, seconds)
    print(f"reference: {len(records)} step(s) written to the reference file {path.resolve()}",
          file=sys.stderr, flush=True)


def run_reference(
    cfg: TrajectoryConfig,
    token_file: str | Path,
    device: torch.device,
    *,
    cache: bool = True,
    reference_file: str | Path | None = None,
) -> list[StepRecord]:
    it = iter_reference(cfg, token_file, device, cache=cache, reference_file=reference_file)
    return [rec for rec, _ in it]


@dataclass(frozen=True)
class TrajectoryStep:
    """One streamed step: a reference step (`candidate` None) or a candidate step beside its
    reference step. `source` says where the reference came from ("computed", "cache", "file")."""

    step: int
    reference: StepRecord
    candidate: StepRecord | None
    source: str

    @property
    def side(self) -> str:
        return "reference" if self.candidate is None else "candidate"


def _broadcast(payload: list[Any], distributed: bool, group: dist.ProcessGroup | None) -> None:
    if distributed:
        src = dist.get_global_rank(group, 0) if group is not None else 0
        collectives.broadcast_object_list(payload, src, group, "reference trajectory")


def iter_trajectory(
    cfg: TrajectoryConfig,
    token_file: str | Path,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    *,
    reference_file: str | Path | None = None,
) -> Iterator[TrajectoryStep]:
    """Every reference step, then every candidate step, each as soon as it exists; call on every
    rank. Rank 0 runs (or reads) the reference and yields its steps as they come, then broadcasts
    it; the other ranks yield the reference steps after the broadcast. A failure of the reference
    on rank 0 is broadcast too, so every rank raises (NonFiniteTrajectory stays that class)."""
    distributed = dist.is_initialized() and cfg.cp_mode != "none"
    rank = dist.get_rank(group) if distributed else 0
    reference: list[StepRecord] = []
    source = "computed"
    if rank == 0:
        try:
            for rec, source in iter_reference(cfg, token_file, device, reference_file=reference_file):
                reference.append(rec)
                yield TrajectoryStep(len(reference) - 1, rec, None, source)
        except BaseException as exc:  # the other ranks must learn of it, not wait in the broadcast
            if distributed:
                with contextlib.suppress(Exception):  # a broken group: the original error says more
                    _broadcast([("error", (type(exc).__name__, str(exc)))], distributed, group)
            raise
        _broadcast([("ok", (reference, source))], distributed, group)
    else:
        payload: list[Any] = [None]
        _broadcast(payload, distributed, group)
        status, value = payload[0]
        if status == "error":
            kind, message = value
            if kind == NonFiniteTrajectory.__name__:
                raise NonFiniteTrajectory(message)
            if kind == ReferenceFileMismatch.__name__:
                raise ReferenceFileMismatch(message)
            raise RuntimeError(f"the reference failed on CP rank 0 with {kind}: {message}")
        reference, source = value
        for i, rec in enumerate(reference):
            yield TrajectoryStep(i, rec, None, source)
    trainer = candidate_trainer(cfg, token_file, device, group)
    for s, cand in enumerate(iter_steps(trainer, cfg.steps, "candidate")):
        yield TrajectoryStep(s, reference[s], cand, source)


def run_trajectory(
    cfg: TrajectoryConfig,
    token_file: str | Path,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    *,
    reference_file: str | Path | None = None,
) -> TrajectoryComparison:
    """`iter_trajectory` collected: reference on CP rank 0 (broadcast), candidate on every rank."""
    reference, candidate = [], []
    for ev in iter_trajectory(cfg, token_file, device, group, reference_file=reference_file):
        if ev.candidate is None:
            reference.append(ev.reference)
        else:
            candidate.append(ev.candidate)
    return TrajectoryComparison(reference, candidate)


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
