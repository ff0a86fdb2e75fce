"""Benchmark of the compare engine: two jobs of ~100k raw samples each (bar, from the store to
the verdict: 0.3 s).

    python benchmarks/compare_bench.py [--samples 100000] [--ranks 4] [--repeat 5] [--store]

The synthetic jobs mimic a CP suite: every case has two time metrics (20 repetitions on every
rank), two memory metrics (one per rank) and eight tensors x four accuracy metrics (one per
rank), so the time statistics (bootstrap + Mann-Whitney) run on hundreds of series at once.
A second layout (`--layout time`) makes every sample a timing on one rank: the worst case for
the statistics (5,000 series of 20).
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from service.domain.compare import CaseInfo, JobRef, JobSide, SampleTable, compare
from workers.stats import summarise
from workers.suite import Metric


def make_job(job_id: int, samples: int, ranks: int, layout: str, slowdown: float, seed: int) -> JobSide:
    rng = np.random.default_rng(seed)
    levels = np.random.default_rng(0)  # the same cases on both sides: same levels, own noise
    metrics = [Metric("fwd_ms", "ms", "time"), Metric("fwdbwd_ms", "ms", "time")]
    metrics += [Metric("peak_alloc", "bytes", "memory"), Metric("peak_reserved", "bytes", "memory")]
    tensors = ["o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"]
    kinds = ["rel_l2", "max_abs", "max_rel", "finite"]
    if layout == "cp":
        metrics += [Metric(f"{t}_{k}", "", "accuracy", bound=1e-2 if k == "rel_l2" else None)
                    for t in tensors for k in kinds]
        reps = 20
        per_case = 2 * reps * ranks + 2 * ranks + len(tensors) * len(kinds) * ranks
    else:
        metrics = metrics[:1]
        ranks, reps = 1, 20
        per_case = reps
    n_cases = max(1, samples // per_case)
    n_metrics = len(metrics)
    case_col, metric_col, rank_col, idx_col, value_col = [], [], [], [], []
    for m_code, m in enumerate(metrics):
        n_idx = reps if m.kind == "time" else 1
        shape = (n_cases, ranks, n_idx)
        c, r, i = np.meshgrid(np.arange(n_cases), np.arange(ranks), np.arange(n_idx), indexing="ij")
        if m.kind == "time":
            base = levels.uniform(1, 100, size=(n_cases, 1, 1)) * (1 + slowdown)
            v = base * (1 + 0.03 * rng.standard_normal(shape))
        elif m.kind == "memory":
            v = levels.uniform(1e8, 1e10, size=shape).round()
        else:
            v = np.abs(levels.normal(1e-3, 1e-4, size=shape)) * rng.uniform(0.9, 1.1, size=shape)
        case_col.append(c.ravel())
        metric_col.append(np.full(c.size, m_code))
        rank_col.append(r.ravel())
        idx_col.append(i.ravel())
        value_col.append(v.ravel())
    perm = rng.permutation(sum(len(x) for x in value_col))  # the store returns rows in any order
    table = SampleTable(
        case=np.concatenate(case_col)[perm],
        metric=np.concatenate(metric_col)[perm],
        rank=np.concatenate(rank_col)[perm],
        idx=np.concatenate(idx_col)[perm],
        value=np.concatenate(value_col)[perm].astype(np.float64),
        case_keys=[f"fp{c:06d}" for c in range(n_cases)],
        metric_keys=[m.name for m in metrics],
    )
    cases = {fp: CaseInfo(fp, f"case {fp}", {"T": 8192}) for fp in table.case_keys}
    assert n_metrics == len(table.metric_keys)
    return JobSide(JobRef(job_id, "bench", "full"), cases, {m.name: m for m in metrics}, table)


def store_roundtrip(base: JobSide, head: JobSide, repeat: int) -> dict[str, list[float]]:
    """Store both jobs twice in a temporary SQLite store, once finished as the dispatcher
    finishes a job (summaries and reduced cases written) and once as samples only (a job stored
    before reduced cases existed), then time load_side x2 + compare (what the gate, the compare
    page and `/api/v1/compare` do) of each pair, the two pairs alternating."""
    import shutil
    import tempfile
    from pathlib import Path

    from sqlalchemy.orm import Session

    from service.domain.baselines import compare_jobs
    from service.persistence import cases as case_store
    from service.persistence import samples as sample_store
    from service.persistence.db import make_engine, upgrade
    from service.persistence.models import JobRow
    from service.persistence.summaries import finish_summary
    from workers.suite import Case

    tmp = tempfile.mkdtemp(prefix="gdnval-compare-bench-")
    engine = make_engine(f"sqlite:///{Path(tmp) / 'bench.db'}")
    upgrade(engine)
    pairs: dict[str, list[int]] = {"reduced": [], "samples only": []}
    for kind, ids in pairs.items():
        for side in (base, head):
            with Session(engine) as s, s.begin():
                job = JobRow(suite="bench", preset="full", params={}, device="cpu", world_size=4,
                             status="succeeded")
                s.add(job)
                s.flush()
                mids = sample_store.ensure_metrics(s, "bench", side.metrics.values())
                cases = [Case("bench", fp, {"fp": fp}) for fp in side.samples.case_keys]
                cids = case_store.ensure_cases(s, cases, "cpu", 4)
                ids.append(job.id)
            t = side.samples
            case_ids = np.array([cids[fp] for fp in t.case_keys])[t.case]
            metric_ids = np.array([mids[m] for m in t.metric_keys])[t.metric]
            rows = list(zip(case_ids.tolist(), metric_ids.tolist(), t.rank.tolist(), t.idx.tolist(),
                            t.value.tolist(), strict=True))
            sample_store.insert_samples(engine, ids[-1], rows)
            if kind == "reduced":
                finish_summary(engine, ids[-1], 1)
    times: dict[str, list[float]] = {kind: [] for kind in pairs}
    verdicts = {}
    for _ in range(repeat):
        for kind, (b, h) in pairs.items():
            t0 = time.perf_counter()
            with Session(engine) as s:
                cmp = compare_jobs(s, b, h)
            times[kind].append(time.perf_counter() - t0)
            verdicts[kind] = cmp.to_dict()["cases"]
    engine.dispose()
    shutil.rmtree(tmp)
    if verdicts["reduced"] != verdicts["samples only"]:
        raise AssertionError("the reduced and the samples-only jobs compare differently")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layout", choices=["cp", "time"], default="cp")
    ap.add_argument("--slowdown", type=float, default=0.10, help="head's time change (0.10 = +10%%)")
    ap.add_argument("--store", action="store_true", help="also time loading both jobs from a SQLite store")
    args = ap.parse_args()
    base = make_job(1, args.samples, args.ranks, args.layout, 0.0, 1)
    head = make_job(2, args.samples, args.ranks, args.layout, args.slowdown, 2)
    compare(base, head)  # warm imports (scipy)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        cmp = compare(base, head)
        times.append(time.perf_counter() - t0)
    series = sum(1 for c in cmp.cases for m in c.metrics if m.kind == "time")
    print(
        f"layout={args.layout} samples/job={len(base.samples)}/{len(head.samples)} cases={len(cmp.cases)} "
        f"time-series={series} metric-results={sum(len(c.metrics) for c in cmp.cases)}"
    )
    print(f"compare: median {summarise(times, 'lower').median * 1e3:.0f} ms, min {min(times) * 1e3:.0f} ms "
          f"over {args.repeat} runs ({platform.processor() or platform.machine()}, "
          f"numpy {np.__version__})")
    print("verdicts:", {k: v for k, v in cmp.metric_counts().items() if v})
    if args.store:
        for kind, st in store_roundtrip(base, head, args.repeat).items():
            print(f"store load x2 + compare ({kind}): median {summarise(st, 'lower').median * 1e3:.0f} ms, "
                  f"min {min(st) * 1e3:.0f} ms over {args.repeat} runs (SQLite)")


if __name__ == "__main__":
    main()
