"""The store's SQL pre-grouping gives what `workers.stats` gives on the same samples: the worst
rank per idx (`samples.worst_rank_rows`, what compare reads) and the summaries computed live, and
stored and read back (`summaries`), for NaN, +inf, -inf, one sample, several ranks and both
directions, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import pytest
from sqlalchemy.orm import Session

from service.persistence import cases as case_store
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store
from service.persistence.models import JobRow
from workers import stats, verdict
from workers.suite import Case, Metric

INF, NAN = math.inf, math.nan
METRICS = (
    Metric("t_ms", "ms", "time", "lower", bound=50.0),
    Metric("tput", "x", "time", "higher", bound=2.0),
    Metric("o_rel_l2", "", "accuracy", "lower", bound=1e-2),
)
# idx -> rank -> value; None: the rank did not report that idx. Values have few digits, so that
# SQLite's 15-digit text of a REAL reads back as the same double.
SERIES: dict[str, dict[int, dict[int, float]]] = {
    "finite": {i: {r: round(10 + 3 * math.sin(7 * i + r), 4) for r in range(3)} for i in range(7)},
    "nan": {0: {0: 1.5, 1: 2.5, 2: 0.5}, 1: {0: 1.0, 1: NAN, 2: 3.0}, 2: {0: 4.0, 1: 4.25, 2: 2.0}},
    "pos_inf": {0: {0: 1.5, 1: 2.5, 2: 0.5}, 1: {0: INF, 1: 1.0, 2: 3.0}, 2: {0: 4.0, 1: 4.5, 2: 2.0}},
    "neg_inf": {0: {0: 1.5, 1: 2.5, 2: 0.5}, 1: {0: 2.0, 1: -INF, 2: 3.0}, 2: {0: 4.0, 1: 4.5, 2: 2.0}},
    "both_inf": {0: {0: 1.5, 1: 2.5, 2: 0.5}, 1: {0: INF, 1: 1.0, 2: -INF}},
    "nan_and_inf": {0: {0: NAN, 1: INF, 2: 1.0}, 1: {0: 2.0, 1: 3.0, 2: 1.0}},
    "all_bad": {0: {0: NAN, 1: NAN, 2: NAN}, 1: {0: INF, 1: INF, 2: INF}},
    "one_sample": {0: {0: 7.25}},
    "ragged": {0: {0: 1.0, 1: 2.0}, 1: {0: 5.0}, 2: {1: 0.25, 2: 9.0}},
}


def _store(engine, world_size: int) -> tuple[int, dict[tuple[int, int], list[tuple[int, int, float]]], dict]:
    """A job holding every series for every metric (one rank only when `world_size` is 1); returns
    its id, (case_id, metric_id) -> its (rank, idx, value) rows, and metric id -> definition."""
    with Session(engine) as s, s.begin():
        mids = sample_store.ensure_metrics(s, "s", METRICS)
        cids = case_store.ensure_cases(s, [Case("s", name, {"series": name}) for name in SERIES], "cpu",
                                       world_size)
        job = JobRow(suite="s", preset="quick", device="cpu", world_size=world_size, status="running",
                     attempts=1)
        s.add(job)
        s.flush()
        job_id = job.id
    rows: dict[tuple[int, int], list[tuple[int, int, float]]] = defaultdict(list)
    for name, by_idx in SERIES.items():
        for m in METRICS:
            for idx, by_rank in by_idx.items():
                for rank, value in by_rank.items():
                    if rank < world_size:
                        rows[(cids[name], mids[m.name])].append((rank, idx, value))
    flat = [(c, m, r, i, v) for (c, m), rs in rows.items() for r, i, v in rs]
    sample_store.insert_samples(engine, job_id, flat)
    return job_id, rows, {mids[m.name]: m for m in METRICS}


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=0)


def assert_same_stats(got: stats.MetricStats, want: stats.MetricStats, where: str) -> None:
    for f in ("count", "nonfinite", "samples", "ranks"):
        assert getattr(got, f) == getattr(want, f), (where, f)
    for f in ("median", "p90", "min", "max", "mean", "worst"):
        assert _same(getattr(got, f), getattr(want, f)), (where, f, getattr(got, f), getattr(want, f))
    assert got.passes == want.passes, where


@pytest.mark.parametrize("world_size", [3, 1])
def test_sql_worst_rank_equals_the_module(engine, world_size: int) -> None:
    job_id, rows, metrics = _store(engine, world_size)
    with Session(engine) as s:
        red = sample_store.worst_rank_rows(s, job_id, 1, sample_store.higher_metric_ids(s, "s"), world_size)
    assert len(red) == sum(len({i for _, i, _ in rs}) for rs in rows.values())
    for (c, m), rs in rows.items():
        mine = (red.case_id == c) & (red.metric_id == m)
        want = stats.reduce_ranks(rs, metrics[m].direction)
        got = red.value[mine].tolist()
        assert len(got) == len(want) and all(map(_same, got, want)), (c, metrics[m].name, got, want)
        reporting = [sum(1 for _, i, _ in rs if i == idx) for idx in sorted({i for _, i, _ in rs})]
        assert red.ranks[mine].tolist() == reporting


@pytest.mark.parametrize("world_size", [3, 1])
def test_sql_summaries_live_and_stored_equal_the_module(engine, world_size: int) -> None:
    job_id, rows, metrics = _store(engine, world_size)
    with Session(engine) as s, s.begin():
        live = summary_store.compute_summary(s, job_id)
        summary_store.store_summary(s, job_id, live)
    with Session(engine) as s:
        stored = summary_store.stored_summary(s, job_id, 1)
    assert set(live) == set(stored) == set(rows)
    bad_seen = 0
    for key, rs in rows.items():
        m = metrics[key[1]]
        about = {"metric": m.name, "unit": m.unit, "kind": m.kind, "bound": m.bound}
        want = stats.summarise_samples(rs, m.direction, **about)
        want = replace(want, passes=verdict.judge_metric(m, want).ok)
        assert_same_stats(live[key], want, f"live {key} {m.name}")
        assert_same_stats(stored[key], want, f"stored {key} {m.name}")
        bad_seen += want.nonfinite
    assert bad_seen > 0  # the non-finite series were counted, not dropped
