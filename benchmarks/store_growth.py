"""Page and API read times as the store grows: 50, 500 and 2000 jobs (~10M samples at 2000).

    python benchmarks/store_growth.py [--sizes 50,500,2000] [--repeat 15] [--db URL]

Grows one store (a fresh SQLite file unless `--db` names another) through the store's own write
path, job by job as the dispatcher leaves them (commit row, metric and case rows, samples,
case results, the job-end summaries, the verdict), alternating two suites so that a series lives
in half the jobs. At each size it times, through the real app in-process (no network), the job
list, the job page of the newest job, the compare page of the two newest jobs of a suite, the
history page of one series, the suite history, and the API's job list, job, report and
compare-by-commit reads (median wall and CPU ms); and the ingest rate (`insert_samples` alone) and the
whole write path per job of the jobs just written. Prints two Markdown tables (wall, CPU).

Every read is meant to be flat in the size of the store: a time that grows with the number of
jobs is a missing index or a query that walks every job.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.persistence import cases as case_store
from service.persistence import commits, db
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store
from service.persistence.models import CaseRow, JobRow
from workers.stats import summarise
from workers.suite import Case, Metric

SUITES = ("growth-a", "growth-b")
CASES = 20
RANKS = 8
REPS = 8  # 20 cases x 4 metrics x 8 ranks x 8 repetitions = 5120 samples per job
METRICS: tuple[Metric, ...] = (
    Metric("fwd_ms", "ms", "time"),
    Metric("fwd_bwd_ms", "ms", "time"),
    Metric("peak_allocated", "bytes", "memory"),
    Metric("o_rel_l2", "", "accuracy", bound=1e-2),
)


def grow(engine: Any, first: int, last: int, rng: np.random.Generator) -> tuple[int, float, float]:
    """Write jobs `first`..`last-1`; returns (samples written, seconds in `insert_samples`,
    seconds per job for the whole write path)."""
    samples, inserting, spent = 0, 0.0, 0.0
    for n in range(first, last):
        suite = SUITES[n % len(SUITES)]
        cases = [Case(suite, f"T{1024 * (i + 1)}", {"seq_len": 1024 * (i + 1), "mode": "p2p"})
                 for i in range(CASES)]
        t0 = time.perf_counter()
        with db.write_tx(engine) as s:
            commit = commits.ensure_commit(s, f"{n:040x}")
            job = JobRow(suite=suite, preset="quick", params={}, device="cuda", world_size=RANKS,
                      status="running", attempts=1, commit=commit, progress_total=CASES,
                      info={"torch": "2.13.0", "device_name": "bench"})
            s.add(job)
            s.flush()
            job_id = job.id
            mids = sample_store.ensure_metrics(s, suite, METRICS)
            cids = case_store.ensure_cases(s, cases, "cuda", RANKS)
        vals = rng.normal(10.0, 0.2, (CASES, len(METRICS), RANKS, REPS))
        rows = [(cids[c.name], mids[m.name], r, i, float(vals[ci, mi, r, i]))
                for ci, c in enumerate(cases) for mi, m in enumerate(METRICS)
                for r in range(RANKS) for i in range(REPS)]
        t1 = time.perf_counter()
        sample_store.insert_samples(engine, job_id, rows)
        inserting += time.perf_counter() - t1
        with db.write_tx(engine) as s:
            for c in cases:
                case_store.set_case_result(s, job_id, cids[c.name], "passed", None)
        summary_store.finish_summary(engine, job_id, 1)
        with db.write_tx(engine) as s:
            s.get(JobRow, job_id).status = "succeeded"
        summary_store.record_verdict(engine, job_id, ran=True)
        spent += time.perf_counter() - t0
        samples += len(rows)
    return samples, inserting, spent / max(1, last - first)


def time_get(client: Any, path: str, repeat: int) -> tuple[float, float]:
    """Median wall ms and median CPU ms of this process over `repeat` GETs after one warm-up (on
    a shared machine the wall time includes waiting for a core; the CPU time is the request's
    own cost)."""
    r = client.get(path)
    assert r.status_code == 200, (path, r.status_code, r.text[:300])
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        r = client.get(path)
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        assert r.status_code == 200, (path, r.status_code)
    return summarise(wall, "lower").median, summarise(cpu, "lower").median


def pages(engine: Any) -> dict[str, str]:
    """The paths timed at each size (they move with the newest jobs)."""
    with Session(engine) as s:
        newest = s.scalars(
            select(JobRow).where(JobRow.suite == SUITES[0]).order_by(JobRow.id.desc()).limit(2)
        ).all()
        head, base = newest[0], newest[1]
        case = s.scalar(select(CaseRow).where(CaseRow.suite == SUITES[0]).order_by(CaseRow.id).limit(1))
        fp = case.fingerprint
    return {
        "job list": "/jobs",
        "job page": f"/jobs/{head.id}",
        "compare": f"/compare?base={base.id}&head={head.id}",
        "history (one series)": f"/history?fingerprint={fp}&metric=fwd_bwd_ms",
        "suite history": f"/history/{SUITES[0]}",
        "API job list": "/api/v1/jobs",
        "API job": f"/api/v1/jobs/{head.id}",
        "API report": f"/api/v1/jobs/{head.id}/report",
        "API compare by commit": f"/api/v1/compare?suite={SUITES[0]}&base_commit={base.commit_sha}"
                                 f"&head_commit={head.commit_sha}",
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {os.cpu_count()} cores, load average {load:.1f}, Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="50,500,2000", help="job counts to measure at, ascending")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--db", default=None, help="store URL (default: a fresh SQLite file)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if sizes != sorted(sizes) or sizes[0] < 2:
        raise SystemExit(f"--sizes {args.sizes!r}: expected ascending job counts of at least 2")
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'growth.db'}"
        engine = db.make_engine(url)
        db.upgrade(engine)
        rng = np.random.default_rng(0)
        app = create_app(Settings(db_url=url, dispatch=False, executor="local"))
        results: list[tuple[int, int, float, float, dict[str, tuple[float, float]]]] = []
        done, total = 0, 0
        with TestClient(app) as client:
            for size in sizes:
                n, inserting, per_job = grow(engine, done, size, rng)
                done, total = size, total + n
                times = {name: time_get(client, path, args.repeat) for name, path in pages(engine).items()}
                results.append((size, total, n / inserting, per_job * 1000, times))
                shown = ", ".join(f"{k} {w:.1f} ms (cpu {c:.1f})" for k, (w, c) in times.items())
                print(f"{size} jobs: {total:,} samples; {shown}", file=sys.stderr, flush=True)
        engine.dispose()
    print(f"machine: {machine()}; {args.repeat} timed requests per cell after one warm-up; "
          f"{CASES} cases x {len(METRICS)} metrics x {RANKS} ranks x {REPS} repetitions per job")
    names = list(results[0][4])
    for which, label in ((0, "wall"), (1, "CPU")):
        print(f"\n{label} ms, median per request:\n")
        print("| jobs | samples | ingest samples/s | job written ms | " + " | ".join(names) + " |")
        print("| ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in names) + " |")
        for size, total, rate, per_job, times in results:
            print(f"| {size} | {total:,} | {rate:,.0f} | {per_job:.0f} | "
                  + " | ".join(f"{times[k][which]:.1f}" for k in names) + " |")


if __name__ == "__main__":
    main()
