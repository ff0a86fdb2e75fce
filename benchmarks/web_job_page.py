"""Server time of the job page for a job with ~100k samples (acceptance: < 300 ms).

Builds a throw-away SQLite store (migrations, the store's own ingest functions), ingests one
CP-shaped job (8 ranks: timings per repetition and rank, trajectories per step, per-tensor errors)
and one single-lane job (100k repetitions of one metric on one rank: the binning path), then
times `GET /jobs/{id}` through the real app in-process (`create_app` + TestClient, no network):
median and max of N requests after one warm-up.

The CP job is timed in three states: running with no case summary stored (the worst case: every
case computed live from the raw samples, as for a job ingested outside the dispatcher), running
as the dispatcher leaves it (15 of 16 cases ended, their summaries stored at each case's end by
the same store calls as `StoreSink`; the 16th, with all its samples, in progress and computed
live), and finished (the job-end step stored the last case). The one-lane job's single case is
in progress while it runs (live, 100k samples), then finished.

    .venv/bin/python benchmarks/web_job_page.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from sqlalchemy import select

from service.persistence import cases as case_store
from service.persistence import db
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store
from service.persistence.models import JobRow, SampleRow
from workers.stats import summarise
from workers.suite import Case, Metric

SUITE = "web-bench"
TENSORS = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
METRICS: tuple[Metric, ...] = (
    *(Metric(f"{b}_{kind}_ms", "ms", "time") for b in ("ulysses", "p2p") for kind in ("fwd", "fwd_bwd")),
    *(Metric(f"{t}_{s}", "", "accuracy", bound=1e-2 if s == "rel_l2" else None)
      for t in TENSORS for s in ("rel_l2", "max_abs", "max_rel")),
    *(Metric(f"{t}_finite", "bool", "check", "higher", bound=1.0) for t in TENSORS),
    Metric("peak_allocated", "bytes", "memory"),
    Metric("loss_max_rel", "", "trajectory", bound=4e-4),
    Metric("grad_norm_max_rel", "", "trajectory", bound=1e-2),
    Metric("one_lane_ms", "ms", "time"),
)


def _job(s: Session, world: int, status: str) -> JobRow:
    job = JobRow(suite=SUITE, preset="full", params={}, device="cuda", world_size=world, status=status,
              attempts=1, info={"torch": "2.13.0", "device_name": "bench"})
    s.add(job)
    s.flush()
    return job


def ingest_cp_job(engine, *, cases: int = 16, ranks: int = 8, reps: int = 100, steps: int = 200) -> int:
    """~106k samples: per case 4 time metrics x ranks x reps, 2 trajectories x ranks x steps,
    per-tensor errors x ranks, memory per rank."""
    rng = np.random.default_rng(0)
    suite_cases = [Case(SUITE, f"T{16 * (i + 1)}k", {"seq_len": 16384 * (i + 1), "mode": "p2p"})
                   for i in range(cases)]
    with Session(engine) as s, s.begin():
        job = _job(s, ranks, "running")
        mids = sample_store.ensure_metrics(s, SUITE, METRICS)
        cids = case_store.ensure_cases(s, suite_cases, "cuda", ranks)
        for c in suite_cases[:-1]:  # the last case is still running
            case_store.set_case_result(s, job.id, cids[c.name], "passed", None)
        job_id = job.id
    rows: list[tuple[int, int, int, int, float]] = []
    for c in suite_cases:
        cid = cids[c.name]
        for m in METRICS:
            if m.kind == "time" and m.name != "one_lane_ms":
                vals = rng.normal(100, 2, (ranks, reps))
                rows += [(cid, mids[m.name], r, i, float(vals[r, i]))
                         for r in range(ranks) for i in range(reps)]
            elif m.kind == "trajectory":
                vals = rng.random((ranks, steps)) * 1e-4
                rows += [(cid, mids[m.name], r, i, float(vals[r, i]))
                         for r in range(ranks) for i in range(steps)]
            elif m.kind in ("accuracy", "check", "memory"):
                v = 1.0 if m.kind == "check" else float(rng.random() * 1e-3)
                rows += [(cid, mids[m.name], r, 0, v) for r in range(ranks)]
    sample_store.insert_samples(engine, job_id, rows)
    return job_id, len(rows), [cids[c.name] for c in suite_cases]


def ingest_one_lane_job(engine, n: int = 100_000) -> tuple[int, int]:
    """One case, one timed metric, n repetitions on one rank (drawn as histogram bins)."""
    rng = np.random.default_rng(1)
    case = Case(SUITE, "one-lane", {"seq_len": 8192})
    with Session(engine) as s, s.begin():
        job = _job(s, 1, "running")
        mids = sample_store.ensure_metrics(s, SUITE, METRICS)
        cid = case_store.ensure_cases(s, [case], "cuda", 1)[case.name]
        job_id = job.id
    vals = rng.lognormal(2.3, 0.05, n)
    rows = [(cid, mids["one_lane_ms"], 0, i, float(v)) for i, v in enumerate(vals)]
    sample_store.insert_samples(engine, job_id, rows)
    return job_id, n


def end_case(engine, job_id: int, case_id: int) -> None:
    """What `StoreSink.case_result` does when a case ends: record it, store its summary."""
    with db.write_tx(engine) as s:
        case_store.set_case_result(s, job_id, case_id, "passed", None)
    with Session(engine) as s:
        summary = summary_store.compute_summary(s, job_id, case_ids=[case_id], attempt=1)
    with db.write_tx(engine) as s:
        summary_store.store_summary(s, job_id, summary, case_ids=[case_id], attempt=1)


def finish(engine, job_id: int, last_case: int) -> float:
    """The last case ends (as above), then the dispatcher's job-end step; returns its seconds."""
    end_case(engine, job_id, last_case)
    t0 = time.perf_counter()
    summary_store.finish_summary(engine, job_id, 1)
    dt = time.perf_counter() - t0
    with Session(engine) as s, s.begin():
        s.get(JobRow, job_id).status = "succeeded"
    return dt


def time_page(client, path: str, repeat: int) -> tuple[float, float, float, int]:
    """Median and max wall ms, and median CPU ms of the process (on a shared, loaded machine the
    wall time includes waiting for a core; the CPU time is what the request itself costs)."""
    r = client.get(path)  # warm-up (template compilation, caches)
    assert r.status_code == 200, (r.status_code, r.text[:500])
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        r = client.get(path)
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        assert r.status_code == 200
    return summarise(wall, "lower").median, max(wall), summarise(cpu, "lower").median, len(r.content)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        engine = db.make_engine(url)
        db.upgrade(engine)
        t0 = time.perf_counter()
        cp_id, cp_n, cp_cases = ingest_cp_job(engine)
        lane_id, lane_n = ingest_one_lane_job(engine)
        ingest_s = time.perf_counter() - t0
        with Session(engine) as s:
            lane_case = s.scalar(select(SampleRow.case_id).where(SampleRow.job_id == lane_id).limit(1))
        app = create_app(Settings(db_url=url, dispatch=False, executor="local"))
        results = []
        with TestClient(app) as client:
            def row(label: str, job_id: int, n: int) -> None:
                results.append((label, n, *time_page(client, f"/jobs/{job_id}", args.repeat)))

            row("CP job, running, no case summary stored (worst case: 16 cases live)", cp_id, cp_n)
            t0 = time.perf_counter()
            for cid in cp_cases[:-1]:
                end_case(engine, cp_id, cid)
            per_case_ms = (time.perf_counter() - t0) * 1000 / (len(cp_cases) - 1)
            row("CP job, running, 15 cases ended and stored, 1 in progress (live)", cp_id, cp_n)
            row("one lane, running, its one case in progress (live)", lane_id, lane_n)
            end_cp = finish(engine, cp_id, cp_cases[-1])
            end_lane = finish(engine, lane_id, lane_case)
            row("CP job, finished (stored summaries)", cp_id, cp_n)
            row("one lane, finished (stored summaries)", lane_id, lane_n)
        engine.dispose()
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {cpu}, {os.cpu_count()} cores, load average {load:.1f}; Python "
          f"{platform.python_version()}; ingest {ingest_s:.1f} s; {args.repeat} timed requests per row "
          "after one warm-up")
    print(f"storing a CP case's summary at its end: {per_case_ms:.0f} ms per case (~6.6k samples); "
          f"job-end step: CP {end_cp * 1000:.0f} ms, one lane {end_lane * 1000:.0f} ms")
    print("| job | samples | wall median ms | wall max ms | CPU median ms | page KiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, n, med, mx, cpu_ms, size in results:
        print(f"| {label} | {n:,} | {med:.0f} | {mx:.0f} | {cpu_ms:.0f} | {size / 1024:.0f} |")


if __name__ == "__main__":
    main()
