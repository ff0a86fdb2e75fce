"""Per-case summaries: stored when a case ends, read by a running job's page, tagged by attempt.

The sink stores a case's summary as soon as the case ends, so a running job's pages compute
live only the cases still in progress; the job's end only fills in what is missing; a case
re-run in a new attempt never shows the earlier attempt's summary.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from service.dispatcher import Dispatcher, StoreSink
from service.domain import submission
from service.persistence import db
from service.persistence import summaries as summary_store
from service.persistence.models import JobRow, SummaryRow
from service.settings import Settings
from tests.support.api_support import FAKE, FakeExecutor
from workers.suite import Sample

pytestmark = pytest.mark.stores("sqlite")  # the `engine` of these tests is a SQLite file

WORLD = 2


def _running_job(engine, attempts: int = 1) -> JobRow:
    with Session(engine, expire_on_commit=False) as s, s.begin():
        job = JobRow(suite=FAKE, preset="quick", params={"cases": 3}, device="cpu", world_size=WORLD,
                  status="running", attempts=attempts)
        s.add(job)
    return job


def _samples(case: str, base: float, n: int = 40) -> list[Sample]:
    """Both metrics on both ranks; rank 1 is worse (slower, lower throughput) on odd idx."""
    out = []
    for i in range(n):
        for r in range(WORLD):
            worse = r == 1 and i % 2
            out.append(Sample(case, "time_ms", base + i + (5.0 if worse else 0.0), rank=r, idx=i))
            out.append(Sample(case, "throughput", 100.0 - i - (3.0 if worse else 0.0), rank=r, idx=i))
    return out


def _stored_cases(engine, job_id: int, attempt: int) -> set[int]:
    with Session(engine) as s:
        q = select(SummaryRow.case_id).where(SummaryRow.job_id == job_id, SummaryRow.attempt == attempt)
        return set(s.scalars(q))


def _spy_live(monkeypatch: pytest.MonkeyPatch) -> list[list[int] | None]:
    """Records which cases each live computation is asked for."""
    calls: list[list[int] | None] = []
    real = summary_store.compute_summary

    def spy(session, job_id, *, case_ids=None, attempt=None):
        calls.append(None if case_ids is None else sorted(case_ids))
        return real(session, job_id, case_ids=case_ids, attempt=attempt)

    monkeypatch.setattr(summary_store, "compute_summary", spy)
    return calls


def test_a_case_summary_is_stored_at_its_end_and_the_running_page_reads_it(
    engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _running_job(engine)
    sink = StoreSink(engine, job, tmp_path / "artifacts")
    c0, c1 = sink.case_ids["c0"], sink.case_ids["c1"]
    sink.samples(_samples("c0", 10.0))
    sink.samples(_samples("c1", 20.0)[:30])  # c1 is still running
    assert _stored_cases(engine, job.id, 1) == set()
    sink.case_result("c0", "passed")
    assert _stored_cases(engine, job.id, 1) == {c0}

    with Session(engine) as s:
        live = summary_store.compute_summary(s, job.id)  # every case from the raw samples
        stored = summary_store.stored_summary(s, job.id, 1)
    assert set(stored) == {(c0, m) for m in sink.metric_ids.values()}
    assert stored == {k: v for k, v in live.items() if k[0] == c0}  # the same numbers as live
    ms = stored[(c0, sink.metric_ids["time_ms"])]
    assert (ms.count, ms.samples, ms.ranks, ms.max) == (40, 80, 2, 10.0 + 39 + 5.0)  # worst rank
    assert stored[(c0, sink.metric_ids["throughput"])].min == 100.0 - 39 - 3.0

    calls = _spy_live(monkeypatch)
    with Session(engine) as s:
        assert summary_store.summarize_job(s, job.id) == live
    assert calls == [[c1]]  # only the case in progress is computed live

    calls.clear()
    app = create_app_for(engine, tmp_path)
    with TestClient(app) as client:
        page = client.get(f"/jobs/{job.id}")
        cases = client.get(f"/api/v1/jobs/{job.id}/cases").json()["items"]
    assert page.status_code == 200 and "c0" in page.text and "c1" in page.text
    assert calls and all(c == [c1] for c in calls), calls
    by_name = {c["name"]: c for c in cases}
    assert by_name["c0"]["metrics"]["time_ms"]["median"] == live[(c0, sink.metric_ids["time_ms"])].median
    assert by_name["c1"]["metrics"]["time_ms"]["count"] == 8  # 30 rows: idx 0..7 (2 metrics x 2 ranks)
    assert by_name["c1"]["metrics"]["time_ms"]["median"] == live[(c1, sink.metric_ids["time_ms"])].median


def create_app_for(engine, tmp_path: Path):
    from service.app import create_app

    return create_app(Settings(db_url=str(engine.url), dispatch=False, executor="local",
                               artifacts_dir=tmp_path / "artifacts"))


def test_samples_after_a_case_end_reopen_its_summary(engine, tmp_path: Path) -> None:
    job = _running_job(engine)
    sink = StoreSink(engine, job, tmp_path / "artifacts")
    c0 = sink.case_ids["c0"]
    sink.samples(_samples("c0", 10.0, n=10))
    sink.case_result("c0", "passed")
    assert _stored_cases(engine, job.id, 1) == {c0}
    sink.samples([Sample("c0", "time_ms", 1e6, rank=0, idx=99)])  # late: the stored one is stale
    assert _stored_cases(engine, job.id, 1) == set()
    with Session(engine) as s:
        assert summary_store.summarize_job(s, job.id)[(c0, sink.metric_ids["time_ms"])].max == 1e6
    sink.case_result("c0", "passed")
    with Session(engine) as s:
        assert summary_store.stored_summary(s, job.id, 1)[(c0, sink.metric_ids["time_ms"])].count == 11


def test_a_retry_keeps_finished_cases_and_never_shows_an_unfinished_ones_earlier_summary(
    engine, tmp_path: Path
) -> None:
    job = _running_job(engine)
    first = StoreSink(engine, job, tmp_path / "artifacts")
    c0, c1 = first.case_ids["c0"], first.case_ids["c1"]
    t_ms = first.metric_ids["time_ms"]
    first.samples(_samples("c0", 500.0, n=10))
    first.case_result("c0", "passed")
    first.samples(_samples("c1", 700.0, n=10))  # interrupted inside c1
    assert _stored_cases(engine, job.id, 1) == {c0}
    with Session(engine) as s:
        finished = summary_store.stored_summary(s, job.id, 1)[(c0, t_ms)]

    with Session(engine, expire_on_commit=False) as s, s.begin():  # interrupted, re-queued, claimed again
        retry = s.get(JobRow, job.id)
        retry.attempts = 2
    with Session(engine) as s:  # attempt 2 has not started yet: nothing, not attempt 1's numbers
        assert summary_store.summarize_job(s, job.id) == {}

    second = StoreSink(engine, retry, tmp_path / "artifacts")
    assert second.kept == {"c0": 1}
    assert _stored_cases(engine, job.id, 1) == set() and _stored_cases(engine, job.id, 2) == {c0}
    with Session(engine) as s:  # c0 kept as it was; c1's unfinished attempt-1 samples not shown
        shown = summary_store.summarize_job(s, job.id)
    assert {c for c, _ in shown} == {c0} and shown[(c0, t_ms)] == finished
    second.samples(_samples("c1", 1.0, n=10))
    first.samples(_samples("c1", 900.0, n=10))  # the interrupted run's dispatcher still reports
    first.case_result("c1", "passed")
    second.case_result("c1", "passed")
    with Session(engine) as s:
        shown = summary_store.summarize_job(s, job.id)
        live2 = summary_store.compute_summary(s, job.id, attempt=2)
    assert shown == live2 and {c for c, _ in shown} == {c0, c1}
    assert shown[(c1, t_ms)].max == 1.0 + 9 + 5.0  # attempt 2's c1 only

    assert summary_store.finish_summary(engine, job.id, 2) == 0  # both ended: nothing left to compute
    with Session(engine) as s:
        attempts = set(s.scalars(select(SummaryRow.attempt).where(SummaryRow.job_id == job.id)))
        assert attempts == {2}  # the zombie's attempt-1 rows are gone at the end


def test_job_end_computes_only_cases_left_without_a_summary(engine, tmp_path: Path) -> None:
    job = _running_job(engine)
    sink = StoreSink(engine, job, tmp_path / "artifacts")
    sink.samples(_samples("c0", 10.0, n=8))
    sink.case_result("c0", "passed")
    sink.samples(_samples("c1", 20.0, n=8))  # the job ended (cancelled) inside c1
    assert summary_store.finish_summary(engine, job.id, 1) == 2  # c1's two metrics
    with Session(engine) as s, s.begin():
        live = summary_store.compute_summary(s, job.id)
        s.get(JobRow, job.id).status = "cancelled"
    with Session(engine) as s:
        assert summary_store.stored_summary(s, job.id, 1) == live
        assert summary_store.summarize_job(s, job.id) == live


def test_dispatcher_run_stores_each_case_as_it_ends(engine, tmp_path: Path, monkeypatch) -> None:
    """End to end through the dispatcher and an executor: every case's rows exist before the
    job's end step, which then writes nothing; the stored rows equal the live computation."""
    written: list[int] = []
    real_finish = summary_store.finish_summary

    def finish_spy(engine_, job_id, attempt):
        with Session(engine_) as s:
            written.append(len(summary_store.stored_summary(s, job_id, attempt)))
        n = real_finish(engine_, job_id, attempt)
        written.append(n)
        return n

    monkeypatch.setattr(summary_store, "finish_summary", finish_spy)
    settings = Settings(db_url=str(engine.url), executor="local", poll_interval_s=0.05,
                        artifacts_dir=tmp_path / "artifacts")
    executor = FakeExecutor()
    body = {"suite": FAKE, "params": {"cases": 3, "samples": 25, "ranks": 2}, "world_size": 2}
    job = submission.submit_job(engine, settings, body, executor)
    dispatcher = Dispatcher(settings, engine, executor)
    dispatcher.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            with Session(engine) as s:
                if s.get(JobRow, job.id).status == "succeeded":
                    break
            assert time.monotonic() < deadline, "the job did not finish"
            time.sleep(0.05)
    finally:
        dispatcher.stop()
    assert written == [3 * 2, 0]  # 3 cases x 2 metrics stored as they ended; the end adds none
    with Session(engine) as s:
        stored = summary_store.stored_summary(s, job.id, 1)
        live = summary_store.compute_summary(s, job.id)
    assert stored == live and len(live) == 6


def test_migration_tags_existing_summaries_with_their_jobs_attempt(tmp_path: Path) -> None:
    eng = db.make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    db.upgrade(eng, "0001")
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO job (id, suite, preset, params, device, world_size, status, "
                          "priority, labels, progress_done, progress_total, progress_message, info, "
                          "attempts, cancel_requested, created_at) VALUES (1, 's', 'q', '{}', 'cpu', 1, "
                          "'succeeded', 0, '{}', 0, 0, '', '{}', 2, 0, '2026-01-01')"))
        conn.execute(text("INSERT INTO \"case\" (id, fingerprint, suite, name, params, device, world_size) "
                          "VALUES (1, 'fp', 's', 'c', '{}', 'cpu', 1)"))
        conn.execute(text("INSERT INTO metric (id, suite, name, unit, kind, direction, description, "
                          "min_effect) VALUES (1, 's', 'm', '', 'time', 'lower', '', 0.05)"))
        conn.execute(text("INSERT INTO summary (job_id, case_id, metric_id, count, samples, ranks, median) "
                          "VALUES (1, 1, 1, 3, 3, 1, 2.5)"))
    db.upgrade(eng)
    with Session(eng) as s:
        assert s.execute(select(SummaryRow.attempt, SummaryRow.median)).all() == [(2, 2.5)]
        assert summary_store.summarize_job(s, 1)[(1, 1)].median == 2.5  # still served for the finished job
    db.downgrade(eng, "0001")
    with eng.connect() as conn:
        assert conn.execute(text("SELECT median FROM summary")).all() == [(2.5,)]
    eng.dispose()
