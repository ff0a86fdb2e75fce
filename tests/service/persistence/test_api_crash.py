"""kill -9 of the server while a job runs: on restart the job is settled (re-queued once, then
failed with the reason), every sample stored before the kill is still there, and nothing is
half-written (each sample batch is one transaction)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.support.api_support import FAKE, TOKEN, make_server
from tests.support.stores import sqlite_job_row
from tests.support.waiting import wait_until

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
        wait_until(lambda: _count(db, job_id, 1) >= 3 * BATCH, 60, "attempt 1 stores 3 batches")
        server.kill9()

        first = _rows(db, job_id)
        assert sqlite_job_row(db, job_id)[:2] == ("running", 1)  # the crash left it running
        assert first and len(first) % BATCH == 0, "a batch was half-written"

        server.start()  # settles on start: attempt 1 < 2 -> re-queued, and it runs again
        wait_until(lambda: _count(db, job_id, 2) >= 2 * BATCH, 60, "attempt 2 stores 2 batches")
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
        # tests/service/persistence/test_queue.py
        r = httpx.post(f"{server.base}/api/v1/jobs/{job_id}/cancel", headers=auth)
        assert r.status_code == 200
        wait_until(lambda: sqlite_job_row(db, job_id)[0] == "cancelled", 60, "the job cancelled")
        final = _rows(db, job_id)
        assert len(final) % BATCH == 0 and {k: final[k] for k in first} == first
    finally:
        server.stop()


def _per_case(db: Path, job_id: int, sql: str) -> dict[str, list[tuple]]:
    """Rows of `sql` (first column a case id) for the job, by case name."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = dict(con.execute('SELECT id, name FROM "case"').fetchall())
        out: dict[str, list[tuple]] = {}
        for row in con.execute(sql, (job_id,)).fetchall():
            out.setdefault(names[row[0]], []).append(row[1:])
        return out
    finally:
        con.close()


def _results(db: Path, job_id: int) -> dict[str, list[tuple]]:
    return _per_case(db, job_id, "SELECT case_id, attempt, status FROM case_result WHERE job_id = ?")


def _log_events(server, job_id: int) -> list[dict]:
    events = httpx.get(f"{server.base}/api/v1/jobs/{job_id}/events", params={"kind": "log", "limit": 500})
    return events.json()["items"]


def _kept(server, job_id: int) -> list[dict[str, int]]:
    """What each resume of the job kept: case name -> the attempt that ran it."""
    return [e["data"]["kept"] for e in _log_events(server, job_id) if e["data"] and "kept" in e["data"]]


def _resumed_job(server, db: Path, job_id: int, attempts: int, samples: int, cases: int) -> None:
    """The job succeeded in `attempts` runs with every case once: its result, its samples (as
    many as an undisturbed run stores) and its summary."""
    job = httpx.get(f"{server.base}/api/v1/jobs/{job_id}").json()
    assert (job["status"], job["attempts"], job["verdict"]) == ("succeeded", attempts, "passed"), job
    assert job["case_counts"]["passed"] == cases
    names = [f"c{i}" for i in range(cases)]
    assert _results(db, job_id) == {n: [(attempts, "passed")] for n in names}
    latest = _per_case(db, job_id, "SELECT case_id, idx FROM sample WHERE job_id = ? AND attempt = "
                                   f"{attempts}")
    assert {n: len(v) for n, v in latest.items()} == dict.fromkeys(names, 2 * samples)
    shown = httpx.get(f"{server.base}/api/v1/jobs/{job_id}/cases").json()["items"]
    assert {c["name"]: c["metrics"]["time_ms"]["count"] for c in shown} == dict.fromkeys(names, samples)


@pytest.mark.slow  # a real server, killed and restarted
def test_kill9_after_the_last_case_only_completes_the_job(tmp_path: Path) -> None:
    server = make_server(tmp_path, executor="tests.support.api_support:make_fake_executor")
    db = tmp_path / "gdnval.db"
    params = {"cases": 2, "samples": 20, "linger_s": 120}
    server.start()
    try:
        r = httpx.post(f"{server.base}/api/v1/jobs", json={"suite": FAKE, "params": params},
                       headers={"Authorization": f"Bearer {TOKEN}"})
        job_id = r.json()["id"]
        wait_until(lambda: len(_results(db, job_id)) == 2, 60, "two cases stored")
        server.kill9()
        assert sqlite_job_row(db, job_id)[:2] == ("running", 1)
        server.start()
        wait_until(lambda: sqlite_job_row(db, job_id)[0] not in ("running", "queued"), 60, "the job ended")
        _resumed_job(server, db, job_id, attempts=2, samples=20, cases=2)
        assert len(_rows(db, job_id)) == 2 * 2 * 20  # not one sample more than the first run stored
        assert _kept(server, job_id) == [{"c0": 1, "c1": 1}]
    finally:
        server.stop()


@pytest.mark.slow  # a real server, killed twice mid-job
def test_kill9_mid_job_twice_never_reruns_a_finished_case(tmp_path: Path) -> None:
    server = make_server(tmp_path, executor="tests.support.api_support:make_fake_executor",
                         GDNVAL_MAX_ATTEMPTS="3")
    db = tmp_path / "gdnval.db"
    params = {"cases": 3, "samples": 100, "batch": 50, "pause_s": 0.4}
    server.start()
    try:
        r = httpx.post(f"{server.base}/api/v1/jobs", json={"suite": FAKE, "params": params},
                       headers={"Authorization": f"Bearer {TOKEN}"})
        job_id = r.json()["id"]
        for attempt, case in ((1, "c0"), (2, "c1")):
            wait_until(lambda a=attempt, c=case: (a, "passed") in _results(db, job_id).get(c, []), 60,
                       f"{case} passed in attempt {attempt}")
            server.kill9()
            server.start()
        wait_until(lambda: sqlite_job_row(db, job_id)[0] not in ("running", "queued"), 90, "the job ended")
        _resumed_job(server, db, job_id, attempts=3, samples=100, cases=3)
        everywhere = _per_case(db, job_id, "SELECT case_id, attempt FROM sample WHERE job_id = ?")
        assert len(everywhere["c0"]) == 200  # finished in attempt 1, never run again
        assert _kept(server, job_id) == [{"c0": 1}, {"c0": 1, "c1": 2}]
    finally:
        server.stop()
