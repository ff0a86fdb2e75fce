"""Store benchmarks: bulk sample ingest rate and the summary time of a 1M-sample job.

    python benchmarks/store_bench.py [--samples 1000000] [--ranks 8] [--db PATH]

Writes into a fresh SQLite file (WAL, synchronous=NORMAL, as the service does) through the same
functions the dispatcher's sink and the API use, and prints one line per measurement.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from service.persistence.cases import ensure_cases
from service.persistence.db import make_engine, session_factory, upgrade
from service.persistence.models import JobRow
from service.persistence.samples import ensure_metrics, insert_samples
from service.persistence.summaries import case_summaries, compute_summary, finish_summary, store_summary
from workers.suite import Case, Metric


def _time_case_summaries(Session: Any, job_id: int, what: str, runs: int = 3) -> None:
    """What the API and pages read for a job, timed `runs` times."""
    for attempt in range(runs):
        t0 = time.perf_counter()
        with Session() as s:
            summary = case_summaries(s, job_id)
        dt = time.perf_counter() - t0
        print(f"case_summaries {what} [{attempt}]: {len(summary)} cases x "
              f"{len(summary[0].metrics)} metrics in {dt:.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--metrics", type=int, default=4)
    ap.add_argument("--batch", type=int, default=10_000, help="samples per sink call (one transaction)")
    ap.add_argument("--db", type=Path, default=None)
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory()
    db = args.db or Path(tmp.name) / "bench.db"
    engine = make_engine(f"sqlite:///{db}")
    upgrade(engine)
    metrics = [Metric(f"m{i}", "ms", "time", "higher" if i % 2 else "lower") for i in range(args.metrics)]
    cases = [Case("bench", f"case{i}", {"i": i}) for i in range(args.cases)]
    Session = session_factory(engine)
    with Session.begin() as s:
        mids = ensure_metrics(s, "bench", metrics)
        cids = ensure_cases(s, cases, "cpu", args.ranks)
        job = JobRow(suite="bench", preset="quick", device="cpu", world_size=args.ranks, status="running")
        s.add(job)
        s.flush()
        job_id = job.id

    per_idx = args.cases * args.metrics * args.ranks
    n_idx = max(1, args.samples // per_idx)
    rng = np.random.default_rng(0)
    values = rng.random(n_idx * per_idx).tolist()
    rows = []
    k = 0
    for c in cids.values():
        for m in mids.values():
            for idx in range(n_idx):
                for r in range(args.ranks):
                    rows.append((c, m, r, idx, values[k]))
                    k += 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, load {load:.2f}, "
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}"
    )
    print(f"samples={len(rows)} cases={args.cases} metrics={args.metrics} ranks={args.ranks} idx={n_idx}")

    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, len(rows), args.batch):
        insert_samples(engine, job_id, rows[start : start + args.batch])
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"ingest cpu: {cpu:.2f} s of this process = {len(rows) / cpu:,.0f} samples per cpu-second")
    print(
        f"ingest: {len(rows)} samples in {dt:.2f} s = {len(rows) / dt:,.0f} samples/s "
        f"(batches of {args.batch}, one transaction each)"
    )

    sink_ingest(engine, args.ranks, args.batch, min(len(rows), 200_000))

    for attempt in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        with Session() as s:
            live = compute_summary(s, job_id)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(
            f"summary computed from raw samples [{attempt}]: {len(live)} (case, metric) pairs "
            f"from {len(rows)} samples in {dt:.3f} s (cpu {cpu:.3f} s)"
        )
    # the dispatcher's path: each case's summary is stored when the case ends (StoreSink), so a
    # running job computes live only the case in progress, and the job's end only what is left
    case_list = list(cids.values())
    t0 = time.perf_counter()
    for cid in case_list[:-1]:
        with Session() as s:
            one = compute_summary(s, job_id, case_ids=[cid], attempt=1)
        with Session.begin() as s:
            store_summary(s, job_id, one, case_ids=[cid], attempt=1)
    dt = time.perf_counter() - t0
    print(
        f"case summary stored at each case's end: {len(case_list) - 1} cases in {dt:.3f} s "
        f"= {dt / (len(case_list) - 1) * 1000:.1f} ms per case ({len(rows) // len(case_list)} samples each)"
    )
    _time_case_summaries(Session, job_id, f"of the running job, {len(case_list) - 1} cases stored + 1 live")
    t0 = time.perf_counter()
    written = finish_summary(engine, job_id, 1)
    with Session.begin() as s:
        s.get(JobRow, job_id).status = "succeeded"
    print(f"job-end step (finish_summary: cases left without one): {written} rows in "
          f"{time.perf_counter() - t0:.3f} s")
    t0 = time.perf_counter()
    with Session.begin() as s:
        store_summary(s, job_id)
    print(f"store_summary of the whole job from raw samples (recompute, for comparison): "
          f"{time.perf_counter() - t0:.3f} s")
    _time_case_summaries(Session, job_id, "of the finished job")
    engine.dispose()


def sink_ingest(engine, ranks: int, batch: int, n: int) -> None:
    """The dispatcher's path: `Sample` objects through `StoreSink.samples` (names -> ids, insert)."""
    from service.dispatcher import StoreSink
    from workers.suite import Sample

    with session_factory(engine).begin() as s:
        job = JobRow(suite="bench-sink", preset="quick", device="cpu", world_size=ranks, status="running",
                  attempts=1)
        s.add(job)
    sink = StoreSink(engine, job, Path(tempfile.gettempdir()))
    # the order a suite reports in: case by case, metric by metric, idx by idx, every rank
    per_case = max(1, n // (50 * 4 * ranks))
    samples = [
        Sample(f"case{c}", f"m{m}", float(i + r), rank=r, idx=i)
        for c in range(50)
        for m in range(4)
        for i in range(per_case)
        for r in range(ranks)
    ]
    n = len(samples)
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, n, batch):
        sink.samples(samples[start : start + batch])
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"sink ingest: {n} Sample objects through StoreSink.samples in {dt:.2f} s = {n / dt:,.0f} samples/s "
        f"(cpu {cpu:.2f} s = {n / cpu:,.0f} per cpu-second)"
    )


if __name__ == "__main__":
    main()
