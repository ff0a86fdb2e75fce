"""Jobs end on their own and leave nothing behind, against a real server (uvicorn subprocess,
SQLite file, local executor):

- a rank that sleeps forever, with no deadline configured, fails its job within the suite's
  default deadline, naming the rank and its case;
- `kill -9` of the server while a rank and the child it started run: no process of the job is
  alive 5 s later;
- a child started with `setsid` ends with its rank's normal end;
- an orderly shutdown (SIGTERM) re-queues the running job without using up a retry.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.support.api_support import FAKE, TOKEN, make_server
from tests.support.hardening_suites import NAME, SUITE
from tests.support.stores import sqlite_job_row
from tests.support.waiting import wait_until as _wait
from workers.deadline import default_deadline_s

AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXECUTOR = "tests.support.hardening_suites:make_executor"




def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def _descendants(pid: int, below: int = 1) -> set[int]:
    """The live processes `below` or more levels under `pid`: for the server at 1, its rank fork
    server, ranks and their children; at 2, the ranks (the fork server's) and their children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    children.setdefault(int(f.read().rsplit(b")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = set(), [(pid, 0)]
    while todo:
        parent, level = todo.pop()
        for child in children.get(parent, ()):
            if level + 1 >= below:
                found.add(child)
            todo.append((child, level + 1))
    return {p for p in found if _alive(p)}


def _submit(base: str, params: dict) -> dict:
    r = httpx.post(f"{base}/api/v1/jobs", json={"suite": NAME, "params": params}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()


HUNG_TEST = "test_a_hung_rank_ends_its_job_within_the_default_deadline"


@pytest.fixture(scope="module", autouse=True)
def hung_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The hung-rank test's server and job, started with the module when that test is selected:
    the job waits out its default deadline while the module's other tests run (that test is
    the module's last; it reads the job's own times, so waiting longer changes nothing)."""
    if not any(item.name == HUNG_TEST for item in request.session.items):
        yield None
        return
    server = make_server(tmp_path_factory.mktemp("hung"), executor=EXECUTOR).start()
    try:
        yield server, _submit(server.base, {})
    finally:
        server.stop()


@pytest.mark.slow  # a real server and rank process trees
def test_kill9_of_the_server_ends_the_rank_and_its_child(tmp_path: Path) -> None:
    server = make_server(tmp_path, executor=EXECUTOR).start()
    pid_file = tmp_path / "pids"
    try:
        _submit(server.base, {"child": "group", "pid_file": str(pid_file)})
        rank, child = map(int, _wait(lambda: pid_file.exists() and pid_file.read_text(), 60, "pids").split())
        assert os.getpgid(child) == os.getpgid(rank) == rank  # the child is in the rank's group
        started = _descendants(server.proc.pid)
        assert started >= {rank, child}
        server.kill9()
        _wait(lambda: not any(map(_alive, started)), 5.0, "no process under the server alive 5 s later")
    finally:
        server.stop()


@pytest.mark.slow  # a real server and rank process trees
def test_a_setsid_child_ends_with_its_ranks_normal_end(tmp_path: Path) -> None:
    from tests.support.hardening_suites import make_executor
    from tests.support.suites import RecordingSink
    from workers.executors.base import JobSpec

    pid_file = tmp_path / "pids"
    executor = make_executor()
    spec = JobSpec(job_id=1, suite=NAME, params={"hang": False, "child": "setsid", "pid_file": str(pid_file)})
    sink = RecordingSink()
    outcome = executor.run(spec, sink, sink.cancel)
    assert outcome.status == "succeeded", outcome
    _, child = map(int, pid_file.read_text().split())
    assert not _alive(child), "the setsid child outlived its rank"


@pytest.mark.slow  # a real server and rank process trees
def test_sigterm_requeues_without_using_up_a_retry(tmp_path: Path) -> None:
    server = make_server(tmp_path, executor="tests.support.api_support:make_fake_executor")
    db = tmp_path / "gdnval.db"
    server.start()
    try:
        params = {"cases": 2, "samples": 4000, "batch": 100, "pause_s": 0.05}
        r = httpx.post(f"{server.base}/api/v1/jobs", json={"suite": FAKE, "params": params}, headers=AUTH)
        job_id = r.json()["id"]
        _wait(lambda: sqlite_job_row(db, job_id)[0] == "running", 30, "attempt 1 runs")
        server.proc.send_signal(signal.SIGTERM)  # orderly: the dispatcher re-queues the job
        server.proc.wait(30)
        assert sqlite_job_row(db, job_id)[:2] == ("queued", 1)

        server.start()
        _wait(lambda: sqlite_job_row(db, job_id)[:2] == ("running", 2), 30, "attempt 2 runs")
        server.kill9()  # one crash: with max_attempts 2 the job must still be re-queued
        server.start()
        row = _wait(lambda: (r := sqlite_job_row(db, job_id))[1] == 3 and r, 30, "attempt 3 runs")
        assert row[0] in ("running", "succeeded") and row[2] is None, row
        events = httpx.get(f"{server.base}/api/v1/jobs/{job_id}/events", params={"kind": "status"}).json()
        reasons = [e["data"]["reason"] for e in events["items"] if (e["data"] or {}).get("reason")]
        assert reasons[0] == "service shut down while it ran"
        assert reasons[1].startswith("re-queued after attempt 2 was interrupted")
    finally:
        server.stop()


def test_the_default_deadline_scales_and_sets_the_collective_timeout() -> None:
    from workers.deadline import COLLECTIVE_MARGIN_S, DEFAULT_PER_CASE_S, DEFAULT_STARTUP_S, job_deadline_s
    from workers.executors.base import JobSpec
    from workers.executors.local import rank_payload
    from workers.registry import get_suite

    assert default_deadline_s(SUITE, "quick", {}, 4) == 15.0 + 2 * 1.0 * 2.0  # 4 ranks: twice per case
    gdn = get_suite("gdn-op")
    cases = len(gdn.cases(gdn.resolve_params("gate")))
    assert default_deadline_s(gdn, "gate", {}, 1) == DEFAULT_STARTUP_S + DEFAULT_PER_CASE_S["gate"] * cases
    assert job_deadline_s(gdn, "gate", {}, 1, override=20.0) == 20.0  # the service's setting wins
    payload = rank_payload(JobSpec(job_id=1, suite=NAME, deadline_s=17.0), None)
    assert payload["pg_timeout_s"] == 17.0 + COLLECTIVE_MARGIN_S


@pytest.mark.slow  # a real server and rank process trees; its job runs from the module's start
def test_a_hung_rank_ends_its_job_within_the_default_deadline(hung_job) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime

    server, job = hung_job
    expected = default_deadline_s(SUITE, "quick", {}, 1)
    assert expected == 17.0  # 15 s start-up + 2 cases x 1 s x world factor 1

    def final() -> dict | None:
        j = httpx.get(f"{server.base}/api/v1/jobs/{job['id']}").json()
        return j if j["status"] in ("succeeded", "failed", "cancelled") else None

    done = _wait(final, expected + 20, "the hung job ends")
    # from its submission to its end, on the server's clock
    elapsed = (datetime.fromisoformat(done["finished_at"]) - datetime.fromisoformat(done["created_at"]))
    assert done["status"] == "failed", done
    assert done["info"]["deadline_s"] == expected
    error = done["error"]
    assert f"job deadline of {expected:g} s exceeded: rank 0 in case 'hang'" in error, error
    assert elapsed.total_seconds() < expected + 15, elapsed
    page = httpx.get(f"{server.base}/jobs/{job['id']}").text
    assert 'id="job-deadline">17.0 s (suite default)' in page
    assert _descendants(server.proc.pid, below=2) == set()  # no rank, nor a child of one
