"""A PostgreSQL outage mid-job, against a real server process (`gdnval serve`) on a real
PostgreSQL server that the test stops and starts again (`pg_ctl stop -m fast`, which cuts every
connection, as a restart or a failover does):

- stopped for 5 s and for 30 s while a job writes its samples: the job's thread waits the store
  out, `/readyz` answers 503 meanwhile, and the job then succeeds in its first attempt with
  every sample stored exactly once;
- a cancel sent while the store is away is answered 503 (nothing can record it), and one sent
  once it is back ends the job within seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.api_support import FAKE, TOKEN, make_server
from tests.support.waiting import wait_until as _wait

pytestmark = pytest.mark.slow  # a PostgreSQL server of its own, stopped and started; a real service

AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXECUTOR = "tests.support.api_support:make_fake_executor"
# 3 cases x 2 metrics x 300 idx = 1800 samples in 90 batches of 20, 0.1 s apart: about 10 s
PARAMS = {"cases": 3, "samples": 300, "batch": 20, "pause_s": 0.1}
SAMPLES = 3 * 2 * 300


@pytest.fixture
def pg() -> Iterator[object]:
    """A PostgreSQL server of this test alone: stopping it must not disturb other tests."""
    pytest.importorskip("psycopg")
    from tests.support.postgres_server import PostgresUnavailable, start_server

    try:
        server = start_server()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


def _job(base: str, job_id: int) -> dict:
    return httpx.get(f"{base}/api/v1/jobs/{job_id}", timeout=10).json()


def _stored_samples(pg, database: str, job_id: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(rows, distinct (attempt, case, metric, rank, idx)) of the job's samples, read directly."""
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname={database}") as conn:
        return conn.execute(
            "SELECT count(*), count(DISTINCT (attempt, case_id, metric_id, rank, idx)) FROM sample "
            "WHERE job_id = %s", (job_id,)).fetchone()


def _serve(pg, tmp_path: Path):  # type: ignore[no-untyped-def]
    database = pg.create_database()
    server = make_server(tmp_path, executor=EXECUTOR, GDNVAL_DB_URL=pg.url(database)).start()
    return server, database


def _submit(base: str, **params: float) -> int:
    body = {"suite": FAKE, "params": {**PARAMS, **params}}
    made = httpx.post(f"{base}/api/v1/jobs", json=body, headers=AUTH, timeout=10)
    assert made.status_code == 201, made.text
    return int(made.json()["id"])


def _ready(base: str) -> httpx.Response:
    return httpx.get(f"{base}/readyz", timeout=10)


def _ended(base: str, job_id: int) -> dict | None:
    job = _job(base, job_id)
    return job if job["status"] in ("succeeded", "failed", "cancelled") else None


def _cancel(base: str, job_id: int) -> httpx.Response:
    return httpx.post(f"{base}/api/v1/jobs/{job_id}/cancel", headers=AUTH, timeout=10)


@pytest.mark.parametrize("outage_s", [5, 30])
def test_a_job_outlives_a_store_outage_with_every_sample_stored_once(pg, tmp_path: Path,
                                                                      outage_s: int) -> None:
    server, database = _serve(pg, tmp_path)
    try:
        job_id = _submit(server.base)
        _wait(lambda: _job(server.base, job_id)["progress"]["done"] >= 1, 60, "the first case ended")
        pg.halt()
        halted = time.monotonic()
        try:
            ready = _wait(lambda: (r := _ready(server.base)).status_code == 503 and r, 10, "not ready")
            assert ready.json()["checks"]["database"].startswith("unreachable"), ready.text
            time.sleep(max(0.0, outage_s - (time.monotonic() - halted)))
            assert server.proc.poll() is None, server.log_text()
        finally:
            pg.resume()
        _wait(lambda: _ready(server.base).status_code == 200, 15, "ready again")
        done = _wait(lambda: _ended(server.base, job_id), 120, "the job ends")
        assert done["status"] == "succeeded", (done, server.log_text())
        assert done["attempts"] == 1 and done["verdict"] == "passed", done
        assert done["progress"]["done"] == done["progress"]["total"] == 3, done["progress"]
        assert _stored_samples(pg, database, job_id) == (SAMPLES, SAMPLES)
        assert "the store is unreachable" in server.log_text()
    finally:
        server.stop()


def test_a_cancel_is_refused_while_the_store_is_away_and_honoured_once_it_is_back(pg, tmp_path: Path) -> None:
    server, _ = _serve(pg, tmp_path)
    try:
        job_id = _submit(server.base, linger_s=600)  # it cannot end before the cancel: only a cancel ends it
        _wait(lambda: _job(server.base, job_id)["status"] == "running", 60, "the job runs")
        pg.halt()
        try:
            refused = _cancel(server.base, job_id)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
        finally:
            pg.resume()
        answers: list[str] = []

        def honoured() -> httpx.Response | None:
            r = _cancel(server.base, job_id)
            answers.append(f"{r.status_code}: {r.text[:160]}")
            return r if r.status_code == 200 else None

        try:
            asked = _wait(honoured, 60, "a cancel")
        except AssertionError as exc:
            job, log = _job(server.base, job_id), server.log_text()[-4000:]
            raise AssertionError(f"{exc}; {len(answers)} answers, first {answers[:2]}, last {answers[-2:]}; "
                                 f"job {job}; log:\n{log}") from None
        assert asked.json()["cancel_requested"] is True
        t0 = time.monotonic()
        done = _wait(lambda: _ended(server.base, job_id), 15, "the job ends")
        assert done["status"] == "cancelled" and time.monotonic() - t0 < 5, (done, server.log_text())
    finally:
        server.stop()
