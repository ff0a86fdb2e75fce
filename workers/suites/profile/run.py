"""`profile` on the ranks: one traced forward+backward of the network in one CP mode, written into
the rank's artifacts (what each metric means: `workers.suites.profile.spec`)."""

from __future__ import annotations

import gzip
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gdn import device as devices
from workers.context import RankContext
from workers.suite import Case, Sample
from workers.suites.profile.trace import summarise_trace
from workers.suites.shared.run import case_trainer


def run(ctx: RankContext, case: Case) -> Iterator[Sample]:
    p = case.params
    trainer = case_trainer(ctx, p)
    batch = trainer.batch(0)

    def fwd_bwd() -> None:
        trainer.forward_backward(batch)

    for _ in range(p["warmup"]):
        fwd_bwd()
    devices.synchronize(ctx.device)
    with devices.DeviceProfiler(ctx.device_kind) as prof:  # torch_npu's profiler on Ascend
        fwd_bwd()
        devices.synchronize(ctx.device)
    out_dir = ctx.artifacts_dir or Path(tempfile.mkdtemp(prefix="gdnval-profile-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{case.name.replace('/', '-')}.trace.json.gz"  # Perfetto/chrome://tracing read .gz
    prof.export(path)
    with gzip.open(path, "rt") as f:
        events: list[dict[str, Any]] = json.load(f).get("traceEvents", [])
    written = path.is_file() and ctx.artifacts_dir is not None
    yield Sample(case.name, "trace_written", float(written), rank=ctx.rank)
    yield Sample(case.name, "trace_events", float(len(events)), rank=ctx.rank)
    yield Sample(case.name, "trace_bytes", float(path.stat().st_size), rank=ctx.rank)
    found = summarise_trace(events)
    if found.source == "none":  # the no-CP mode communicates nothing: no collective to time
        return
    yield Sample(case.name, "comm_ms", found.comm_ms, rank=ctx.rank)
    yield Sample(case.name, "compute_ms", found.compute_ms, rank=ctx.rank)
    yield Sample(case.name, "comm_overlap_ms", found.overlap_ms, rank=ctx.rank)
    if found.overlap_share is not None:
        yield Sample(case.name, "comm_overlap_share", found.overlap_share, rank=ctx.rank)
    for f, spent in found.family_ms.items():
        yield Sample(case.name, f"coll_{f}_ms", spent, rank=ctx.rank)
        yield Sample(case.name, f"coll_{f}_calls", float(found.family_calls[f]), rank=ctx.rank)
