"""Measurement helpers shared by every suite: timing repetitions, memory, tensor errors.

The report's method (docs/architecture.md, "How the suites time"): warm up (which also
absorbs Triton compile and autotune), then time the repetitions back to back with device events
(`time_repeats`, the method of `triton.testing.do_bench`); reset peak memory after warm-up.

Suites emit raw per-rank samples (rank = this rank, idx = repetition or step). The worst rank of
each idx (max for lower-is-better metrics, min for higher-is-better) is applied when samples are
summarised or compared, so "rank-max" is derived, never pre-applied. `rank_max` is here for the
few in-run decisions that need it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from gdn import collectives
from gdn import device as devices
from workers.context import RankContext
from workers.suite import Sample
from workers.verdict import relative_l2


class RepeatTimer(Protocol):
    """Brackets one repetition: `start()` and `stop()` mark it, `elapsed_ms()` reads it later.

    On an accelerator the marks are device events (gdn.device.DeviceTimer): recording them waits
    for nothing, and reading waits only for that repetition's end event."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def elapsed_ms(self) -> float: ...


CACHE_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any accelerator's last-level cache (H200: 60 MiB)


def time_repeats(
    ctx: RankContext,
    fn: Callable[[], object],
    *,
    warmup: int = 5,
    repeat: int = 20,
    before: Callable[[], object] | None = None,
    timer: Callable[[], RepeatTimer] | None = None,
) -> list[float]:
    """This rank's milliseconds for each of `repeat` calls of `fn`, after `warmup` untimed calls.

    Device time measured back to back, as `triton.testing.do_bench` does: every repetition is
    bracketed by its own pair of device events and issued without waiting for the one before, with
    the device's cache overwritten between them, and the times are read after the last. The host
    therefore runs ahead of the device, and a backend's launch time counts only where it exceeds
    its device time plus the clear; waiting for the device after every call would add each
    backend's own launch time to its time, unequally. On a CPU
    the marks are a host clock around each call, which is the call's time.

    `before` runs ahead of every call, outside the timed region (resetting gradients, say); it
    must not wait for the device. Ranks are aligned by one barrier before the first repetition
    on an accelerator (the collectives inside `fn` keep them together from there) and by one
    before every repetition on a CPU, so rank-max measures the slowest rank of one repetition.
    `timer` makes the per-repetition timers (default: `DeviceTimer` on this rank's device).
    """
    make = timer or (lambda: devices.DeviceTimer(ctx.device))
    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    devices.synchronize(ctx.device)
    host_clock = ctx.device_kind == "cpu"
    if ctx.distributed and not host_clock:
        collectives.barrier(ctx.group, "timing repetitions")
    timers: list[RepeatTimer] = []
    # As do_bench does: an accelerator's last-level cache is overwritten before every repetition,
    # so each call starts cold and the host enqueues the next call while the device clears.
    flush = None if host_clock else torch.empty(CACHE_FLUSH_BYTES, dtype=torch.int8, device=ctx.device)
    for _ in range(repeat):
        if before is not None:
            before()
        if ctx.distributed and host_clock:
            collectives.barrier(ctx.group, "timing repetition")
        if flush is not None:
            flush.zero_()
        t = make()
        t.start()
        fn()
        t.stop()
        timers.append(t)
    return [t.elapsed_ms() for t in timers]


class ReferenceWork:
    """A fixed CPU workload (small batched products and element-wise passes, the op mix of the
    eager core) whose time is the unit of `time_against_reference`. It is the same in every
    commit that keeps this module, so a change in its time is the machine's, not the code's."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.a = torch.randn(16, 64, 64, generator=gen) * 0.1
        self.b = torch.randn(16, 64, 64, generator=gen) * 0.1
        self.x = torch.randn(1 << 16, generator=gen)

    def __call__(self) -> None:
        c = self.a
        for _ in range(16):  # ~10 ms on one core of the 2-core CI machine, about an eager call
            c = torch.bmm(c, self.b).tanh_()
            (self.x * 1.0001).exp_().log_().cumsum(0)


def time_against_reference(
    ctx: RankContext,
    fn: Callable[[], object],
    *,
    warmup: int = 5,
    repeat: int = 20,
    before: Callable[[], object] | None = None,
) -> tuple[list[float], list[float]]:
    """(milliseconds, reference-relative times) of `repeat` calls of `fn` on a CPU rank.

    The speed of a shared CPU drifts by tens of percent from one second to the next (other
    tenants of the host), which swamps any change in a wall-clock comparison of two jobs run
    minutes apart. Each call is timed between two runs of `ReferenceWork`, and its time over the
    mean of those two is the relative time: the drift slows both and cancels in the ratio (its
    minimum effect: `workers.verdict.REFERENCE_RELATIVE_MIN_EFFECT`). `before` runs ahead of
    every call, untimed, as in `time_repeats`.
    """
    ref = ReferenceWork()
    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    ref()
    timer = devices.DeviceTimer(ctx.device)

    def timed(work: Callable[[], object]) -> float:
        timer.start()
        work()
        timer.stop()
        return timer.elapsed_ms()

    times: list[float] = []
    refs = [timed(ref)]
    for _ in range(repeat):
        if before is not None:
            before()
        if ctx.distributed:
            collectives.barrier(ctx.group, "timing repetition")
        times.append(timed(fn))
        refs.append(timed(ref))
    relative = [t / (0.5 * (refs[i] + refs[i + 1])) for i, t in enumerate(times)]
    return times, relative


def rank_max(ctx: RankContext, values: list[float]) -> list[float]:
    """Element-wise max over ranks (identity on one rank); every rank gets the same list."""
    if not ctx.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device(ctx))
    return collectives.gathered_max(t, ctx.group, "rank-max of timings").cpu().tolist()  # fp64: no all-reduce


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
    """Relative-L2 of every tensor pair of a layer comparison (`workers.harness.cp_compare.LayerComparison`),
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
