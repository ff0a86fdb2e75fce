"""The results store: migrations, SQLite connection setup, ingest atomicity, worst-rank summaries.

Every store test runs twice, on a SQLite file and on a fresh PostgreSQL database (`db_url` in
tests/service/conftest.py); the connection-setup tests are SQLite's own.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, inspect, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.domain.baselines import load_side
from service.persistence import cases as case_store
from service.persistence import db
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store
from service.persistence.models import Base, CaseResultRow, JobRow, SampleRow
from tests.support.paths import ROOT
from workers.suite import Case, Metric

METRICS = (Metric("t_ms", "ms", "time", "lower", bound=5.0), Metric("tput", "x", "time", "higher", bound=2.0))


def _job(engine, world_size: int = 2, cases: int = 1) -> tuple[int, dict[str, int], dict[str, int]]:
    with Session(engine) as s, s.begin():
        mids = sample_store.ensure_metrics(s, "s", METRICS)
        matrix = [Case("s", f"c{i}", {"i": i}) for i in range(cases)]
        cids = case_store.ensure_cases(s, matrix, "cpu", world_size)
        job = JobRow(
            suite="s", preset="quick", device="cpu", world_size=world_size, status="running", attempts=1
        )
        s.add(job)
        s.flush()
        return job.id, cids, mids


def test_migrations_up_down_up_and_orm_matches(db_url: str) -> None:
    eng = db.make_engine(db_url)
    assert db.current_revision(eng) is None
    db.upgrade(eng)
    assert db.current_revision(eng) == db.head_revision() is not None
    tables = set(inspect(eng).get_table_names())
    assert {
        "job",
        "job_event",
        "case",
        "case_result",
        "sample",
        "metric",
        "artifact",
        "baseline",
        "commit",
    } <= tables
    db.downgrade(eng, "base")
    assert set(inspect(eng).get_table_names()) <= {"alembic_version"}
    db.upgrade(eng)
    with eng.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diffs == [], f"ORM and migrated schema differ: {diffs}"
    eng.dispose()


MIGRATE_AT_ONCE = """
import sys, time
from service.persistence import db
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # every process begins together
db.upgrade(db.make_engine(sys.argv[1]))
"""


def test_processes_that_open_a_new_store_at_once_all_migrate_it(db_url: str) -> None:
    """`gdnval run`s started side by side on a store nobody created yet: each migrates under
    the write lock, none fails with "database is locked" or a table that already exists."""
    import time

    start = time.time() + 8  # past every interpreter's start-up
    procs = [subprocess.Popen([sys.executable, "-c", MIGRATE_AT_ONCE, db_url, str(start)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(4)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    assert db.current_revision(db.make_engine(db_url)) == db.head_revision()


def test_migration_tags_existing_case_results_with_their_jobs_attempt(db_url: str) -> None:
    """0003: a case result takes its job's attempt (max(1, attempts)); downgrading keeps each job's
    latest-attempt rows only and restores the (job, case) key."""
    eng = db.make_engine(db_url)
    db.upgrade(eng, "0002")
    job_cols = ("suite, preset, params, device, world_size, status, priority, labels, progress_done, "
                "progress_total, progress_message, info, cancel_requested, created_at")
    job_vals = "'s', 'q', '{}', 'cpu', 1, 'succeeded', 0, '{}', 0, 0, '', '{}', false, '2026-01-01'"
    with eng.begin() as conn:
        for job_id, attempts in ((1, 2), (2, 0)):  # a retried job; one stored without being claimed
            conn.execute(text(f"INSERT INTO job (id, attempts, {job_cols}) "
                              f"VALUES ({job_id}, {attempts}, {job_vals})"))
        conn.execute(text("INSERT INTO \"case\" (id, fingerprint, suite, name, params, device, world_size) "
                          "VALUES (1, 'fp', 's', 'c', '{}', 'cpu', 1)"))
        conn.execute(text("INSERT INTO case_result (job_id, case_id, status, error, at) VALUES "
                          "(1, 1, 'failed', 'bound', '2026-01-01'), "
                          "(2, 1, 'passed', NULL, '2026-01-01')"))
    db.upgrade(eng)
    with Session(eng) as s:
        r = CaseResultRow
        q = select(r.job_id, r.attempt, r.status).order_by(r.job_id)
        assert s.execute(q).all() == [(1, 2, "failed"), (2, 1, "passed")]
        assert [(c.status, c.error) for c in summary_store.case_summaries(s, 1)] == [("failed", "bound")]
        assert [c.status for c in summary_store.case_summaries(s, 2)] == ["passed"]  # still shown
    with Session(eng) as s, s.begin():  # a stale run of job 1 wrote under its old attempt
        case_store.set_case_result(s, 1, 1, "passed", None, attempt=1)
    db.downgrade(eng, "0002")
    with eng.connect() as conn:
        rows = conn.execute(text("SELECT job_id, status FROM case_result ORDER BY job_id")).all()
        assert rows == [(1, "failed"), (2, "passed")]  # the stale attempt-1 row is gone
        assert "attempt" not in {c["name"] for c in inspect(conn).get_columns("case_result")}
        uniques = [u["column_names"] for u in inspect(conn).get_unique_constraints("case_result")]
        assert uniques == [["job_id", "case_id"]]
    eng.dispose()


@pytest.mark.stores("sqlite")
def test_sqlite_connections_are_configured(engine) -> None:
    with engine.connect() as conn:
        pragma = lambda name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("foreign_keys") == 1
        assert pragma("busy_timeout") == db.BUSY_TIMEOUT_MS
        assert pragma("synchronous") == 1  # NORMAL


@pytest.mark.stores("sqlite")
def test_write_tx_takes_the_write_lock_at_begin(engine) -> None:
    """BEGIN IMMEDIATE: a second writer waits (here: times out) instead of reading stale state."""
    import sqlite3

    other = sqlite3.connect(engine.url.database, timeout=0.2, isolation_level=None)
    with db.write_tx(engine) as s:
        s.execute(select(func.count()).select_from(JobRow)).scalar()  # read only, yet the lock is held
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    other.execute("BEGIN IMMEDIATE")  # free again after commit
    other.execute("ROLLBACK")
    other.close()


def test_write_tx_serialises_writers_on_every_store(engine) -> None:
    """SQLite: BEGIN IMMEDIATE; PostgreSQL: the advisory lock. A second read-modify-write waits."""
    import threading
    import time

    held, times = threading.Event(), {}

    def first() -> None:
        with db.write_tx(engine) as s:
            s.execute(select(func.count()).select_from(JobRow)).scalar()
            held.set()
            time.sleep(0.5)
            times["first_end"] = time.monotonic()

    t = threading.Thread(target=first)
    t.start()
    assert held.wait(10)
    with db.write_tx(engine) as s:
        s.execute(select(func.count()).select_from(JobRow)).scalar()  # SQLite takes its lock here
        times["second_start"] = time.monotonic()
    t.join()
    assert times["second_start"] >= times["first_end"]


def test_sample_batch_is_all_or_nothing(engine) -> None:
    job_id, cids, mids = _job(engine)
    c, m = cids["c0"], mids["t_ms"]
    sample_store.insert_samples(engine, job_id, [(c, m, 0, i, 1.0) for i in range(5)])
    bad = [(c, m, 0, i, 2.0) for i in range(5, 10)] + [(999_999, m, 0, 10, 3.0)]  # unknown case id
    with pytest.raises(IntegrityError):
        sample_store.insert_samples(engine, job_id, bad)
    with Session(engine) as s:
        assert s.scalar(select(func.count()).select_from(SampleRow)) == 5


def test_summary_applies_worst_rank_then_statistics(engine) -> None:
    job_id, cids, mids = _job(engine, world_size=3)
    rng = np.random.default_rng(1)
    vals = rng.random((3, 50))  # rank x idx
    rows = []
    for name in ("t_ms", "tput"):
        rows += [(cids["c0"], mids[name], r, i, float(vals[r, i])) for r in range(3) for i in range(50)]
    sample_store.insert_samples(engine, job_id, rows)
    with Session(engine) as s:
        summaries = summary_store.case_summaries(s, job_id)
    (case,) = summaries
    lower, higher = case.metrics["t_ms"], case.metrics["tput"]
    worst_lo, worst_hi = vals.max(axis=0), vals.min(axis=0)
    assert lower.median == pytest.approx(np.median(worst_lo))
    assert lower.p90 == pytest.approx(np.percentile(worst_lo, 90))
    assert (lower.min, lower.max) == pytest.approx((worst_lo.min(), worst_lo.max()))
    assert lower.mean == pytest.approx(worst_lo.mean())
    assert higher.median == pytest.approx(np.median(worst_hi))
    assert (lower.count, lower.samples, lower.ranks) == (50, 150, 3)
    assert lower.passes is True and higher.passes is False  # bound 5 (lower) / 2 (higher)


def test_nan_on_one_rank_poisons_the_summary(engine) -> None:
    job_id, cids, mids = _job(engine)
    rows = [(cids["c0"], mids["t_ms"], r, i, 1.0) for r in range(2) for i in range(4)]
    rows[3] = (cids["c0"], mids["t_ms"], 1, 1, math.nan)
    sample_store.insert_samples(engine, job_id, rows)
    with Session(engine) as s:
        ms = summary_store.case_summaries(s, job_id)[0].metrics["t_ms"]
        page, _ = sample_store.list_samples(s, job_id)
    # the NaN idx is counted as a failed sample (never dropped); the statistics are the finite ones
    assert ms.nonfinite == 1 and ms.count == 4 and ms.passes is False and ms.samples == 8
    assert ms.median == 1.0 and math.isnan(ms.worst)
    assert sum(math.isnan(v.value) for v in page) == 1


def test_stored_summary_equals_live_and_is_read_for_finished_jobs(engine) -> None:
    job_id, cids, mids = _job(engine, world_size=1, cases=3)
    rows = [(c, m, 0, i, float(i * (c + m))) for c in cids.values() for m in mids.values() for i in range(30)]
    sample_store.insert_samples(engine, job_id, rows)
    with Session(engine) as s, s.begin():
        live = summary_store.compute_summary(s, job_id)
        assert summary_store.store_summary(s, job_id) == len(live) == 6
        s.get(JobRow, job_id).status = "succeeded"
    sample_store.insert_samples(engine, job_id, [(cids["c0"], mids["t_ms"], 0, 99, 1e9)])  # after the end
    with Session(engine) as s:
        stored = summary_store.summarize_job(s, job_id)
    assert stored == live  # the stored rows are served, not a recomputation


def test_summaries_read_only_the_latest_attempt(engine) -> None:
    job_id, cids, mids = _job(engine, world_size=1)
    sample_store.insert_samples(
        engine, job_id, [(cids["c0"], mids["t_ms"], 0, i, 100.0) for i in range(5)], attempt=1
    )
    with Session(engine) as s, s.begin():
        s.get(JobRow, job_id).attempts = 2
    rows = [(cids["c0"], mids["t_ms"], 0, i, 1.0) for i in range(5)]
    sample_store.insert_samples(engine, job_id, rows, attempt=2)
    with Session(engine) as s:
        ms = summary_store.case_summaries(s, job_id)[0].metrics["t_ms"]
        everything, _ = sample_store.list_samples(s, job_id)
        first, _ = sample_store.list_samples(s, job_id, attempt=1)
    assert (ms.median, ms.count) == (1.0, 5)
    assert len(everything) == 10 and {v.value for v in first} == {100.0}


def test_fingerprint_series_across_jobs(engine) -> None:
    ids = []
    for k in range(3):
        job_id, cids, mids = _job(engine, world_size=1)
        rows = [(cids["c0"], mids["t_ms"], 0, i, float(k)) for i in range(4)]
        sample_store.insert_samples(engine, job_id, rows)
        with Session(engine) as s, s.begin():
            s.get(JobRow, job_id).status = "succeeded"
        ids.append(job_id)
    fp = Case("s", "c0", {"i": 0}).fingerprint("cpu", 1)
    with Session(engine) as s:
        series = sample_store.fingerprint_series(s, fp, "t_ms")
    assert [j.id for j, _ in series] == ids
    assert [float(w.values.mean()) for _, w in series] == [0.0, 1.0, 2.0]


def test_service_imports_no_torch() -> None:
    code = textwrap.dedent("""
        import sys
        import service, service.app, service.persistence.jobs, service.persistence.queue, service.dispatcher
        import service.api.routes.jobs, service.executor_choice, service.cli
        from service.settings import Settings
        service.app.create_app(Settings(db_url="sqlite://"))
        heavy = sorted(m for m in ("torch", "triton", "ray") if m in sys.modules)
        assert not heavy, heavy
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_cli_modules_import_without_service_dependencies() -> None:
    """The device machine runs `gdnval run` without fastapi/sqlalchemy/uvicorn/httpx installed."""
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("fastapi", "sqlalchemy", "uvicorn", "httpx", "alembic",
                                          "starlette", "pydantic_settings"):
                    raise ImportError(f"blocked {name}")
        sys.meta_path.insert(0, Block())
        from service.cli import main
        assert {"serve", "submit", "jobs", "db"} <= set(main.commands), sorted(main.commands)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_later_bound_never_re_judges_a_stored_summary(engine) -> None:
    job_id, cids, mids = _job(engine, world_size=1)
    sample_store.insert_samples(engine, job_id, [(cids["c0"], mids["t_ms"], 0, i, 4.0) for i in range(5)])
    with Session(engine) as s, s.begin():
        summary_store.store_summary(s, job_id)
    with Session(engine) as s, s.begin():  # a later job's code tightens the bound to 3 ms
        sample_store.ensure_metrics(s, "s", [Metric("t_ms", "ms", "time", "lower", bound=3.0)])
    with Session(engine) as s:
        ms = summary_store.summarize_job(s, job_id)[(cids["c0"], mids["t_ms"])]
        side = load_side(s, job_id)
    assert ms.bound == 5.0 and ms.passes is True  # judged as it was judged when it ran
    assert side.metrics["t_ms"].bound == 5.0  # and compared with that definition
