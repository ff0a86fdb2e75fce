"""`stability` on the ranks: consecutive fwd+bwd passes of one CP mode (what each metric means:
`workers.suites.stability.spec`)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import timedelta

from gdn import device as devices
from gdn.cp import CPConfig
from workers.context import RankContext
from workers.suite import Case, Sample
from workers.suites.shared.run import case_trainer, ulysses_misfit_of_model


def not_applicable(case: Case, world_size: int) -> str | None:
    """Ulysses whose model's GDN heads do not split over the ranks."""
    return ulysses_misfit_of_model(case, world_size)


def run(ctx: RankContext, case: Case) -> Iterator[Sample]:
    p = case.params
    trainer = case_trainer(ctx, p)
    cps: dict[int, CPConfig] = {
        id(m.cp): m.cp for m in trainer.model.modules() if getattr(m, "cp", None) is not None
    }
    for cp in cps.values():  # a hang becomes a CPCommError after the case's limit
        cp.timeout = timedelta(seconds=p["timeout_s"])
    name, r = case.name, ctx.rank
    peaks: list[int] = []
    for i in range(p["passes"]):
        devices.synchronize(ctx.device)
        devices.reset_peak_memory(ctx.device)
        t0 = time.perf_counter()
        loss = trainer.forward_backward(trainer.batch(i))
        devices.synchronize(ctx.device)
        dt = (time.perf_counter() - t0) * 1e3
        value, gn = trainer.global_loss(loss), trainer.grad_norm()
        del loss
        mem = devices.memory_stats(ctx.device)
        peaks.append(mem.peak_allocated)
        finite = math.isfinite(value) and math.isfinite(gn)
        yield Sample(name, "loss", value, rank=r, idx=i)
        yield Sample(name, "finite", float(finite), rank=r, idx=i)
        yield Sample(name, "pass_ms", dt, rank=r, idx=i)
        if mem.tracked:  # a CPU keeps no allocator statistics: no sample rather than a 0
            yield Sample(name, "peak_allocated_bytes", float(peaks[-1]), rank=r, idx=i)
        if not finite:
            break  # the finite sample fails the case; further passes would only repeat it
    yield Sample(name, "passes_done", float(len(peaks)), rank=r)
    if devices.memory_stats(ctx.device).tracked:
        yield Sample(name, "memory_growth_bytes", float(peaks[-1] - peaks[min(1, len(peaks) - 1)]), rank=r)
    checks = sum(cp.stats.order_checks for cp in cps.values())
    yield Sample(name, "order_checks", float(checks), rank=r)

