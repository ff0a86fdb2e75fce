"""Measurement helpers shared by every suite: timing repetitions, memory, tensor errors.

The report's method (VALIDATION_MATRIX §2): warm up (which also absorbs Triton compile and
autotune), then time each repetition with device events; reset peak memory after warm-up.

Suites emit raw per-rank samples (rank = this rank, idx = repetition or step). The worst rank of
each idx (max for lower-is-better metrics, min for higher-is-better) is applied when samples are
summarised or compared, so "rank-max" is derived, never pre-applied. `rank_max` is here for the
few in-run decisions that need it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gdn import device as devices
from workers.context import RankContext
from workers.suite import Sample
from workers.verdict import relative_l2


def time_repeats(
    ctx: RankContext, fn: Callable[[], object], *, warmup: int = 5, repeat: int = 20
) -> list[float]:
    """This rank's milliseconds for each of `repeat` calls of `fn`, after `warmup` untimed calls.

    Ranks are aligned by a barrier before each repetition so that rank-max measures the slowest
    rank of the same repetition, not accumulated skew.
    """
    for _ in range(warmup):
        fn()
    devices.synchronize(ctx.device)
    times: list[float] = []
    timer = devices.DeviceTimer(ctx.device)
    for _ in range(repeat):
        if ctx.distributed:
            dist.barrier(group=ctx.group)
        timer.start()
        fn()
        timer.stop()
        times.append(timer.elapsed_ms())
    return times


def rank_max(ctx: RankContext, values: list[float]) -> list[float]:
    """Element-wise max over ranks (identity on one rank); every rank gets the same list."""
    if not ctx.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device(ctx))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return t.cpu().tolist()


def _collective_device(ctx: RankContext) -> torch.device:
    return torch.device("cpu") if ctx.device_kind == "cpu" else ctx.device


@dataclass(frozen=True)
class MemoryReading:
    """Bytes on this rank. `incremental` readings subtract what was allocated before the call."""

    peak_allocated: int
    peak_reserved: int
    incremental: bool
    tracked: bool


def measure_peak_memory(ctx: RankContext, fn: Callable[[], object], *, incremental: bool) -> MemoryReading:
    """Run `fn` once (after the caller's warm-up) and read the peak memory it reached.

    incremental=True: peak allocated minus the allocation before the call (single-device GDN
    tables); False: the full-process peak allocated and reserved (CP and network tables).
    """
    devices.synchronize(ctx.device)
    devices.reset_peak_memory(ctx.device)
    before = devices.memory_stats(ctx.device)
    fn()
    devices.synchronize(ctx.device)
    after = devices.memory_stats(ctx.device)
    alloc = after.peak_allocated - (before.allocated if incremental else 0)
    reserved = after.peak_reserved - (before.reserved if incremental else 0)
    return MemoryReading(alloc, reserved, incremental=incremental, tracked=after.tracked)


@dataclass(frozen=True)
class TensorError:
    rel_l2: float
    max_abs: float
    max_rel: float
    finite: bool


def tensor_error(actual: torch.Tensor, expected: torch.Tensor, *, eps: float = 1e-12) -> TensorError:
    """‖a−b‖/‖b‖ (`workers.verdict.relative_l2`: the absolute norm against a zero reference), max
    |a−b|, max |a−b|/(|b|+eps) in fp64, and whether `actual` is all finite."""
    a, b = actual.detach().double(), expected.detach().double()
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: actual {tuple(a.shape)} vs expected {tuple(b.shape)}")
    finite = bool(torch.isfinite(a).all())
    diff = (a - b).abs()
    rel_l2 = relative_l2((a - b).norm().item(), b.norm().item()) if a.numel() else 0.0
    if a.numel() == 0:
        return TensorError(0.0, 0.0, 0.0, finite)
    max_rel = (diff / (b.abs() + eps)).max().item()
    return TensorError(rel_l2, diff.max().item(), max_rel, finite)


def worst_rel_l2(pairs: Any) -> dict[str, float]:
    """Relative-L2 of every tensor pair of a layer comparison (`gdn.cp.compare.LayerComparison`),
    by name: output, input_grad and param:<name>."""
    errs = {
        "output": tensor_error(*pairs.output).rel_l2,
        "input_grad": tensor_error(*pairs.input_grad).rel_l2,
    }
    for name, (a, b) in pairs.param_grads.items():
        errs[f"param:{name}"] = tensor_error(a, b).rel_l2
    return errs


def error_samples(ctx: RankContext, case: str, prefix: str, err: TensorError) -> Iterator[Sample]:
    """The four accuracy samples of one tensor: <prefix>_rel_l2, _max_abs, _max_rel, _finite."""
    yield Sample(case, f"{prefix}_rel_l2", err.rel_l2, rank=ctx.rank)
    yield Sample(case, f"{prefix}_max_abs", err.max_abs, rank=ctx.rank)
    yield Sample(case, f"{prefix}_max_rel", err.max_rel, rank=ctx.rank)
    yield Sample(case, f"{prefix}_finite", 1.0 if err.finite else 0.0, rank=ctx.rank)


def time_samples(ctx: RankContext, case: str, metric: str, times_ms: list[float]) -> Iterator[Sample]:
    """This rank's timing samples, one per repetition."""
    for idx, value in enumerate(times_ms):
        yield Sample(case, metric, value, rank=ctx.rank, idx=idx)
