"""The page reads that must stay flat in the size of the store: what they return, and (on SQLite,
whose planner says so) that they walk an index to the rows they need instead of every job.

The times themselves are measured by benchmarks/store_growth.py (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.orm import Session

from service.persistence import cases as case_store
from service.persistence import commits, db, page_queries
from service.persistence import jobs as job_store
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store
from service.persistence.jobs import find_commit_job
from service.persistence.models import JobRow
from workers.suite import Case, Metric

pytestmark = pytest.mark.stores("sqlite")  # the `engine` of these tests is a SQLite file

SUITE = "reads"
METRICS = (Metric("fwd_ms", "ms", "time"), Metric("peak", "bytes", "memory"), Metric("unused", "ms", "time"))


def add_job(engine, sha: str, status: str = "succeeded", value: float = 1.0) -> int:
    cases = [Case(SUITE, "a", {"i": 0}), Case(SUITE, "b", {"i": 1})]
    with db.write_tx(engine) as s:
        commit = commits.ensure_commit(s, sha)
        job = JobRow(suite=SUITE, preset="quick", params={}, device="cpu", world_size=1, status="running",
                  attempts=1, commit=commit)
        s.add(job)
        s.flush()
        mids = sample_store.ensure_metrics(s, SUITE, METRICS)
        cids = case_store.ensure_cases(s, cases, "cpu", 1)
        job_id = job.id
    rows = [(cids["a"], mids["fwd_ms"], 0, i, value + i) for i in range(3)]
    rows += [(cids["b"], mids["peak"], 0, 0, 1024.0)]
    sample_store.insert_samples(engine, job_id, rows)
    summary_store.finish_summary(engine, job_id, 1)
    with db.write_tx(engine) as s:
        s.get(JobRow, job_id).status = status
    return job_id


@contextmanager
def statements(engine) -> Iterator[list[tuple[str, Any]]]:
    """The SQL the code under test sends, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool) -> None:
        seen.append((sql, params))

    event.listen(engine, "before_cursor_execute", keep)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", keep)


def plans(engine, seen: list[tuple[str, Any]]) -> str:
    """SQLite's query plans of those statements, one line per step."""
    out = []
    with engine.connect() as conn:
        for sql, params in seen:
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params).all()
            out.append(" | ".join(str(r[-1]) for r in rows))
    return "\n".join(out)


def test_history_reads_name_the_metrics_with_samples_and_the_newest_succeeded_jobs(engine) -> None:
    ids = [add_job(engine, f"{n:040x}", value=float(n)) for n in range(5)]
    failed = add_job(engine, f"{9:040x}", status="failed")
    with Session(engine) as s:
        a = s.execute(text("SELECT id, fingerprint FROM \"case\" WHERE name = 'a'")).one()
        b = s.execute(text("SELECT fingerprint FROM \"case\" WHERE name = 'b'")).one()
        fwd = s.execute(text("SELECT id FROM metric WHERE name = 'fwd_ms'")).scalar_one()
        # only the metrics this case has samples of: 'unused' is declared, 'peak' is case b's
        assert page_queries.case_metric_names(s, a.fingerprint) == ["fwd_ms"]
        assert page_queries.case_metric_names(s, b.fingerprint) == ["peak"]
        assert page_queries.case_metric_names(s, "no-such-case") == []
        series = page_queries.series_summaries(s, a.id, fwd, last=3)
        # the last three succeeded jobs, oldest first; the failed job is not in the series
        assert [st.job.id for st in series] == ids[2:] and failed not in [st.job.id for st in series]
        assert [st.stats.median for st in series] == [3.0, 4.0, 5.0]  # medians of value + 0, 1, 2
        assert series[-1].job.code_commit == f"{4:040x}" and series[-1].stats.count == 3


def test_page_reads_walk_an_index_not_every_job(engine) -> None:
    add_job(engine, "a" * 40)
    with Session(engine) as s:
        a = s.execute(text("SELECT id, fingerprint FROM \"case\" WHERE name = 'a'")).one()
        with statements(engine) as seen:
            page_queries.series_summaries(s, a.id, 1)
        # one series' summaries: ix_summary_series newest first, then each job by its key
        series = plans(engine, seen)
        assert "USING INDEX ix_summary_series" in series and "TEMP B-TREE" not in series, series
        with statements(engine) as seen:
            job_store.list_jobs(s, status="succeeded", limit=30)
        # the newest jobs of one status (the compare page's list): no sort of every such job
        recent = plans(engine, seen)
        assert "ix_job_status_id" in recent and "TEMP B-TREE" not in recent, recent
        with statements(engine) as seen:
            page_queries.case_metric_names(s, a.fingerprint)
        # the metric picker: one index probe per metric of the suite, not a scan of the samples
        names = plans(engine, seen)
        assert "ix_sample_case (case_id=? AND metric_id=?)" in names and "DISTINCT" not in names, names


def test_a_full_sha_is_one_commit_and_a_prefix_still_matches(engine) -> None:
    short_job = add_job(engine, "ab" * 20)
    long_job = add_job(engine, "ab" * 32)  # a 64-character sha that starts with the 40-character one
    with Session(engine) as s:
        # a full sha names exactly one commit (an index lookup, never a prefix scan)
        assert s.execute(commits.commit_ids("ab" * 20)).scalars().all() == [1]
        assert find_commit_job(s, "ab" * 20, SUITE).id == short_job
        assert find_commit_job(s, "ab" * 32, SUITE).id == long_job
        # a prefix of at least 7 characters matches both, the newest job first
        assert find_commit_job(s, "abababa", SUITE).id == long_job
        assert find_commit_job(s, "ababab", SUITE) is None  # too short for a prefix: must match whole
        assert [j.id for j in job_store.list_jobs(s, commit="abab")[0]] == [long_job, short_job]


def test_the_job_of_a_commit_is_one_rule_for_pages_api_and_gate(engine) -> None:
    """`find_commit_job` is the only lookup: the world size and the overrides asked for must match,
    a filter left None matches any, and a gate re-measurement of some cases is never the commit's job."""
    sha = "cd" * 20
    plain = add_job(engine, sha)
    with db.write_tx(engine) as s:
        commit = commits.ensure_commit(s, sha)
        common = dict(suite=SUITE, preset="quick", device="cpu", status="succeeded", attempts=1,
                      commit=commit)
        wide = JobRow(**common, params={}, world_size=2)
        tuned = JobRow(**common, params={"i": 5}, world_size=1)
        rerun = JobRow(**common, params={}, world_size=1, cases=["a"])
        s.add_all([wide, tuned, rerun])
        s.flush()
        wide_id, tuned_id = wide.id, tuned.id
    with Session(engine) as s:
        assert find_commit_job(s, sha, SUITE).id == tuned_id  # newest whole job; the re-run is skipped
        assert find_commit_job(s, sha, SUITE, world_size=2).id == wide_id
        assert find_commit_job(s, sha, SUITE, world_size=1, params={}).id == plain
        assert find_commit_job(s, sha, SUITE, params={"i": 5}).id == tuned_id
        assert find_commit_job(s, sha, SUITE, world_size=4) is None
        assert find_commit_job(s, sha, SUITE, preset="full") is None
        assert find_commit_job(s, sha[:7], SUITE, world_size=2).id == wide_id
