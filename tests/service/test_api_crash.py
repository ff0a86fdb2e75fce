"""kill -9 of the server while a job runs: on restart the job is settled (re-queued once, then
failed with the reason), every sample stored before the kill is still there, and nothing is
half-written (each sample batch is one transaction)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.support.api_support import FAKE, TOKEN, make_server

BATCH = 100
PARAMS = {"cases": 3, "samples": 2000, "batch": BATCH, "pause_s": 0.05}


def _rows(db: Path, job_id: int) -> dict[int, tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT id, attempt, case_id, metric_id, rank, idx, value FROM sample WHERE job_id = ?", (job_id,)
        ).fetchall()
        return {r[0]: r[1:] for r in rows}
    finally:
        con.close()


def _job_row(db: Path, job_id: int) -> tuple[str, int, str | None]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT status, attempts, error FROM job WHERE id = ?", (job_id,)).fetchone()
    finally:
        con.close()


def _wait(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _count(db: Path, job_id: int, attempt: int) -> int:
    return sum(1 for r in _rows(db, job_id).values() if r[0] == attempt)


@pytest.mark.slow  # a real server, killed and restarted
def test_kill9_mid_job_then_restart_requeues_and_keeps_samples(tmp_path: Path) -> None:
    server = make_server(tmp_path, executor="tests.support.api_support:make_fake_executor")
    db = tmp_path / "gdnval.db"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    server.start()
    try:
        r = httpx.post(f"{server.base}/api/v1/jobs", json={"suite": FAKE, "params": PARAMS}, headers=auth)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        _wait(lambda: _count(db, job_id, 1) >= 3 * BATCH)
        server.kill9()

        first = _rows(db, job_id)
        assert _job_row(db, job_id)[:2] == ("running", 1)  # the crash left it running
        assert first and len(first) % BATCH == 0, "a batch was half-written"

        server.start()  # settles on start: attempt 1 < 2 -> re-queued, and it runs again
        _wait(lambda: _count(db, job_id, 2) >= 2 * BATCH)
        job = httpx.get(f"{server.base}/api/v1/jobs/{job_id}").json()
        assert job["status"] == "running" and job["attempts"] == 2
        events = httpx.get(f"{server.base}/api/v1/jobs/{job_id}/events", params={"kind": "status"}).json()
        reasons = [e["data"]["reason"] for e in events["items"] if e["data"] and "reason" in e["data"]]
        assert reasons and reasons[0].startswith("re-queued after attempt 1 was interrupted: its dispatcher")

        now = _rows(db, job_id)
        assert {k: v for k, v in now.items() if k in first} == first  # attempt 1 untouched
        one = httpx.get(f"{server.base}/api/v1/jobs/{job_id}/samples", params={"attempt": 1, "limit": 10_000})
        assert {s["id"] for s in one.json()["items"]} == set(first)
        cases = httpx.get(f"{server.base}/api/v1/jobs/{job_id}/cases").json()["items"]
        assert cases[0]["metrics"]["time_ms"]["count"] > 0  # live summary of the running attempt
        # a second interruption fails the job with the reason (dead dispatcher pid):
        # tests/service/test_queue.py
        r = httpx.post(f"{server.base}/api/v1/jobs/{job_id}/cancel", headers=auth)
        assert r.status_code == 200
        _wait(lambda: _job_row(db, job_id)[0] == "cancelled")
        final = _rows(db, job_id)
        assert len(final) % BATCH == 0 and {k: final[k] for k in first} == first
    finally:
        server.stop()
