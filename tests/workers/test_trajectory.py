"""Trajectory runner on one process: error bookkeeping, identical sides, NaN stop, config errors."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from workers.harness.trajectory import (
    NonFiniteTrajectory,
    StepRecord,
    TrajectoryComparison,
    TrajectoryConfig,
    run_trajectory,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_max_abs_and_max_rel_are_tracked_independently() -> None:
    ref = [StepRecord(10.0, 100.0), StepRecord(0.01, 1.0)]
    cand = [StepRecord(10.5, 100.0), StepRecord(0.02, 1.0)]
    cmp = TrajectoryComparison(ref, cand)
    abs_err, rel_err = cmp.errors("loss")
    assert abs_err == pytest.approx([0.5, 0.01]) and rel_err == pytest.approx([0.05, 1.0])
    # the largest abs error is at step 0, the largest rel error at step 1
    assert cmp.max_abs("loss") == pytest.approx(0.5) and cmp.max_rel("loss") == pytest.approx(1.0)
    assert cmp.max_abs("grad_norm") == 0.0 and cmp.max_rel("grad_norm") == 0.0
    assert TrajectoryComparison([StepRecord(0.0, 1.0)], [StepRecord(1e-9, 1.0)]).max_rel("loss") == math.inf


def test_same_path_on_both_sides_is_exact(token_file: Path) -> None:
    """No CP and the eager backend on both sides: the runner itself adds no difference."""
    cfg = TrajectoryConfig(cp_mode="none", steps=4, seq_len=64, batch_size=2, valid_lengths=(64, 40))
    cmp = run_trajectory(cfg, token_file, torch.device("cpu"))
    assert len(cmp.reference) == len(cmp.candidate) == 4
    assert cmp.reference == cmp.candidate
    assert cmp.reference[-1].loss < cmp.reference[0].loss  # the non-zero learning rate trains


def test_reference_with_activation_checkpoint_is_the_same_reference(token_file: Path) -> None:
    """reference_checkpoint="full" saves memory, not numbers: same records, same stored key."""
    from workers.harness.trajectory import reference_key, reference_trainer, run_reference

    cfg = TrajectoryConfig(cp_mode="none", steps=3, seq_len=64, batch_size=2, valid_lengths=(64, 40))
    ckpt = dataclasses.replace(cfg, reference_checkpoint="full")
    dev = torch.device("cpu")
    plain = run_reference(cfg, token_file, dev, cache=False)
    assert run_reference(ckpt, token_file, dev, cache=False) == plain and len(plain) == 3
    assert reference_key(ckpt, token_file, dev) == reference_key(cfg, token_file, dev)
    wrapped = reference_trainer(ckpt, token_file, dev).model.layers[0]
    assert type(wrapped).__name__ == "CheckpointWrapper"  # the option reaches the model


def test_other_chunk_size_gives_the_rounding_floor(token_file: Path) -> None:
    """An eager candidate with chunk 16 against the chunk-64 reference: the same function in
    another summation order, so the trajectories differ, but only by rounding."""
    cfg = TrajectoryConfig(cp_mode="none", steps=4, seq_len=128, batch_size=1, candidate_chunk_size=16)
    cmp = run_trajectory(cfg, token_file, torch.device("cpu"))
    assert cmp.reference != cmp.candidate  # the option reaches the candidate's layers
    assert cmp.max_rel("loss") < 1e-5 and cmp.max_rel("grad_norm") < 1e-4


def test_non_finite_stops_with_the_step(token_file: Path) -> None:
    cfg = TrajectoryConfig(cp_mode="none", steps=3, seq_len=32, lr=1e30)
    with pytest.raises(NonFiniteTrajectory, match=r"reference step 1: loss=nan, grad_norm=nan"):
        run_trajectory(cfg, token_file, torch.device("cpu"))


def test_config_errors() -> None:
    with pytest.raises(ValueError, match=r"lr must be > 0"):
        TrajectoryConfig(lr=0.0)
    with pytest.raises(ValueError, match=r"dtype 'float16' is not supported; expected one of"):
        TrajectoryConfig(dtype="float16")
    with pytest.raises(ValueError, match=r"steps must be >= 1, got 0"):
        TrajectoryConfig(steps=0)
