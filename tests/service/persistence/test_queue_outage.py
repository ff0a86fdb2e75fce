"""What the queue does about a store outage and a cluster that went away, on both stores:

- a job its own dispatcher lost (no thread runs it: its end could not be recorded) is re-queued
  without counting as a crash, even on its last attempt;
- after an outage every heartbeat is old: another dispatcher's job is not settled by its lease
  until the settling dispatcher has reached the store for a whole lease;
- a run ended because its cluster went away is re-queued without spending an attempt, up to
  `MAX_CLUSTER_LOSSES` times, then failed naming the count;
- `until_stored` waits out a store that refuses connections and gives up only when told to stop;
- a job whose connection is cut while its sink starts (PostgreSQL terminating the session, as a
  restart does) waits the store out and starts, instead of failing on the broken transaction.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from service.dispatcher import StoreSink
from service.persistence import db, queue
from service.persistence.models import JobEventRow, JobRow
from tests.support.queue_jobs import fake_request, job_row, mark_running


def test_a_job_its_dispatcher_lost_is_requeued_without_counting_a_crash(engine) -> None:
    job_id = queue.submit(engine, fake_request())[0].id
    mark_running(engine, job_id, "me", attempts=2)  # its last attempt under max_attempts 2
    def settle(**kw) -> list:  # type: ignore[no-untyped-def]
        return queue.settle_orphans(engine, "me", lease_s=30, max_attempts=2, **kw)

    assert settle() == []  # the caller did not say which it runs: left alone
    assert settle(held_here={job_id}) == []
    assert settle(held_here=set()) == [(job_id, "queued")]
    assert queue.claim(engine, "me", {"cpu": 1}).id == job_id  # attempt 3: the loss was no crash


def test_a_stale_heartbeat_waits_until_the_settler_reached_the_store_for_a_lease(engine) -> None:
    job_id = queue.submit(engine, fake_request())[0].id
    mark_running(engine, job_id, "elsewhere:1:x", attempts=1, heartbeat_age_s=120)
    assert queue.settle_orphans(engine, "me", lease_s=30, max_attempts=2, lease_ok=False) == []
    assert job_row(engine, job_id).status == "running"
    assert queue.settle_orphans(engine, "me", lease_s=30, max_attempts=2) == [(job_id, "queued")]


def test_a_run_its_cluster_took_down_is_requeued_until_the_cluster_losses_run_out(engine) -> None:
    job_id = queue.submit(engine, fake_request())[0].id

    def lost(why: str = "the Ray cluster went away") -> str | None:
        return queue.requeue_orderly(engine, job_id, "me", why, cluster_lost=True)

    for n in range(1, queue.MAX_CLUSTER_LOSSES + 1):
        assert queue.claim(engine, "me", {"cpu": 1}).id == job_id
        assert lost() == "queued"
        assert job_row(engine, job_id).attempts == n
    assert queue.settle_orphans(engine, "me", lease_s=30, max_attempts=1) == []  # none of them a crash
    assert queue.claim(engine, "me", {"cpu": 1}).id == job_id
    assert lost() == "failed"
    job = job_row(engine, job_id)
    assert job.error == (f"its cluster went away {queue.MAX_CLUSTER_LOSSES + 1} times while it ran; "
                         "last: the Ray cluster went away")
    assert job.verdict == "errored"
    assert lost("again") is None  # no longer held


def test_until_stored_waits_for_a_store_that_refuses_connections() -> None:
    pytest.importorskip("psycopg")
    from tests.support.ports import free_port

    eng = db.make_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none")
    stop = threading.Event()
    tries: list[float] = []

    def connect() -> int:
        tries.append(time.monotonic())
        with Session(eng) as s:
            return s.get(JobRow, 1) is not None

    threading.Timer(1.5, stop.set).start()
    with pytest.raises(db.StoreUnavailable, match="stopped waiting for the store while a test read"):
        db.until_stored(connect, "a test read", stop)
    assert len(tries) >= 3 and tries[-1] - tries[0] < 2.0  # tried again and again, then gave up on stop
    ok = db.until_stored(lambda: 42, "a test read", stop)
    assert ok == 42
    with pytest.raises(ZeroDivisionError):  # an error of the work itself is never retried
        db.until_stored(lambda: 1 / 0, "a test read", stop)
    eng.dispose()


@pytest.mark.stores("postgresql")  # a server that terminates one session, as a restart does
def test_a_sink_whose_connection_is_cut_while_it_starts_waits_the_store_out(engine, tmp_path: Path) -> None:
    import psycopg

    queue.submit(engine, fake_request())
    job = queue.claim(engine, "me", {"cpu": 1})
    assert job is not None
    cut: list[int] = []

    def terminate_once(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        """Before the first write of the suite's metrics, have the server end this session."""
        if cut or not statement.lstrip().startswith("INSERT INTO metric"):
            return
        cut.append(cursor.connection.info.backend_pid)
        url = engine.url.set(drivername="postgresql")
        with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (cut[0],))

    event.listen(engine, "before_cursor_execute", terminate_once)
    try:
        sink = StoreSink(engine, job, tmp_path / "artifacts", threading.Event())
    finally:
        event.remove(engine, "before_cursor_execute", terminate_once)
    assert cut, "the metrics' insert never ran: nothing was cut"
    assert set(sink.metric_ids) == {"time_ms", "throughput"}, sink.metric_ids
    assert sink.expected, "the suite's cases were not expanded"
    with Session(engine) as s:
        logs = s.scalars(select(JobEventRow.message).where(JobEventRow.job_id == job.id)).all()
    assert not [m for m in logs if "could not expand" in m], logs
