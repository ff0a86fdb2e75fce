"""The durable queue and the dispatcher: claims, limits, priority, cancel, idempotency, orphans.

Every test runs on a SQLite file and on a fresh PostgreSQL database (`db_url`, tests/service/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.dispatcher import Dispatcher
from service.persistence import queue
from service.persistence.models import JobEventRow, JobRow, SampleRow
from service.settings import Settings
from tests.support.api_support import FakeExecutor
from tests.support.paths import ROOT
from tests.support.queue_jobs import fake_request, job_row, mark_running
from tests.support.waiting import wait_until
from workers.executors.base import check_placement


def test_claim_order_priority_then_age_within_device_limits(engine) -> None:
    a = queue.submit(engine, fake_request(priority=0))[0].id
    b = queue.submit(engine, fake_request(priority=5))[0].id
    c = queue.submit(engine, fake_request(priority=5))[0].id
    g = queue.submit(engine, fake_request(device="cuda", priority=100))[0].id
    limits = {"cpu": 2, "cuda": 0, "npu": 0}
    assert queue.claim(engine, "d1", limits).id == b
    assert queue.claim(engine, "d1", limits).id == c
    assert queue.claim(engine, "d1", limits) is None  # cpu limit 2 reached; cuda limit 0
    assert queue.finish(engine, b, "d1", "succeeded")
    assert queue.claim(engine, "d1", limits).id == a
    assert job_row(engine, g).status == "queued"
    assert not queue.finish(engine, a, "someone-else", "failed")  # only the owner finishes
    with pytest.raises(ValueError, match="final status must be one of"):
        queue.finish(engine, a, "d1", "running")


def test_claim_takes_only_what_fits_now_per_device_kind(engine) -> None:
    """A kind whose best job does not fit claims nothing (later, smaller jobs of that kind do not
    jump it); other kinds are not held back."""
    wide = queue.submit(engine, fake_request(world_size=4, priority=9))[0].id
    narrow = queue.submit(engine, fake_request(world_size=1))[0].id
    gpu = queue.submit(engine, fake_request(device="cuda", world_size=2))[0].id
    limits = {"cpu": 4, "cuda": 4, "npu": 4}
    free = {"cpu": 2, "cuda": 2}
    seen: list[int] = []

    def fits(job: JobRow) -> bool:
        seen.append(job.id)
        return job.world_size <= free.get(job.device, 0)

    assert queue.claim(engine, "d1", limits, fits).id == gpu
    assert queue.claim(engine, "d1", limits, fits) is None  # the 4-rank cpu job heads its kind
    assert narrow not in seen and job_row(engine, narrow).status == "queued"
    free["cpu"] = 4
    assert queue.claim(engine, "d1", limits, fits).id == wide
    assert queue.claim(engine, "d1", limits, fits).id == narrow


class CapacityExecutor(FakeExecutor):
    """The fake executor with a free-rank count per device kind, as a cluster executor reports."""

    def __init__(self, free: dict[str, int]) -> None:
        self.free = free

    def free_ranks(self, device: str, placement: str | None = None) -> int | None:
        if placement is not None:
            check_placement(placement)
        return self.free.get(device, 0)

    def most_ranks(self, device: str, placement: str | None = None) -> int:
        return 4


def test_a_job_that_can_no_longer_fit_is_handed_to_the_executor_not_left_blocking(
    engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submitted while the cluster was larger: after a grace for nodes still joining, claimed
    (the executor fails it with the reason), so the jobs of its kind behind it run."""
    from service import dispatcher

    monkeypatch.setattr(dispatcher, "UNPLACEABLE_GRACE_S", 1.0)
    settings = Settings(db_url=str(engine.url), poll_interval_s=0.05, artifacts_dir=Path("unused"),
                        device_limits={"cpu": 4})
    d = Dispatcher(settings, engine, CapacityExecutor({"cpu": 2}))
    d.start()
    try:
        too_wide = queue.submit(engine, fake_request(world_size=6, priority=1))[0].id
        behind = queue.submit(engine, fake_request(world_size=2))[0].id
        time.sleep(0.5)
        assert job_row(engine, too_wide).status == job_row(engine, behind).status == "queued"  # the grace
        wait_until(lambda: job_row(engine, behind).status == "succeeded", 20, "behind succeeded")
        assert job_row(engine, too_wide).attempts == 1  # it was claimed and handed over
    finally:
        d.stop()


def test_dispatcher_leaves_what_does_not_fit_queued_and_never_stalls(engine) -> None:
    settings = Settings(db_url=str(engine.url), poll_interval_s=0.05, artifacts_dir=Path("unused"),
                        device_limits={"cpu": 4, "cuda": 4})
    ex = CapacityExecutor({"cpu": 1})
    d = Dispatcher(settings, engine, ex)
    d.start()
    try:
        wide = queue.submit(engine, fake_request(world_size=2))[0].id
        odd = queue.submit(engine, fake_request(device="cuda", labels={"placement": "bogus"}))[0].id
        # claimed: the executor decides
        wait_until(lambda: job_row(engine, odd).status == "succeeded", 20, "odd succeeded")
        time.sleep(0.3)  # several ticks
        assert job_row(engine, wide).status == "queued"  # fits the cluster, not its free ranks
        ex.free["cpu"] = 2
        wait_until(lambda: job_row(engine, wide).status == "succeeded", 20, "wide succeeded")
    finally:
        d.stop()


def test_idempotency_key_returns_the_same_job_and_rejects_a_different_request(engine) -> None:
    first, created = queue.submit(engine, fake_request(idempotency_key="k1", params={"cases": 1}))
    again, created_again = queue.submit(engine, fake_request(idempotency_key="k1", params={"cases": 1}))
    assert created and not created_again and again.id == first.id
    with pytest.raises(queue.JobConflict, match="idempotency key 'k1' already names job"):
        queue.submit(engine, fake_request(idempotency_key="k1", params={"cases": 2}))
    with Session(engine) as s:
        assert s.scalar(select(func.count()).select_from(JobRow)) == 1


def test_concurrent_submits_with_one_key_make_one_job(engine) -> None:
    ids: list[int] = []
    lock = threading.Lock()

    def go() -> None:
        job, _ = queue.submit(engine, fake_request(idempotency_key="same"))
        with lock:
            ids.append(job.id)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and len(set(ids)) == 1


def test_cancel_queued_running_and_finished(engine) -> None:
    queued = queue.submit(engine, fake_request())[0].id
    assert queue.cancel(engine, queued).status == "cancelled"
    with pytest.raises(queue.JobConflict, match=r"already cancelled; only queued or running"):
        queue.cancel(engine, queued)
    with pytest.raises(queue.JobNotFound, match="no job 12345"):
        queue.cancel(engine, 12345)

    settings = Settings(db_url=str(engine.url), poll_interval_s=0.05, artifacts_dir=Path("unused"))
    d = Dispatcher(settings, engine, FakeExecutor())
    d.start()
    try:
        slow = queue.submit(engine, fake_request(preset="slow"))[0].id
        wait_until(lambda: job_row(engine, slow).status == "running", 20, "slow running")
        wait_until(lambda: job_row(engine, slow).progress_done >= 0 and _n_samples(engine, slow) > 0, 20,
                   "slow stores samples")
        assert queue.cancel(engine, slow).cancel_requested
        wait_until(lambda: job_row(engine, slow).status == "cancelled", 20, "slow cancelled")
        stored = _n_samples(engine, slow)
        assert 0 < stored < 3 * 400 * 2  # stopped early; what it reported stays
    finally:
        d.stop()


def _n_samples(engine, job_id: int) -> int:
    with Session(engine) as s:
        return int(s.scalar(select(func.count()).where(SampleRow.job_id == job_id)) or 0)


def test_dispatcher_runs_a_job_through_the_sink(engine, tmp_path: Path) -> None:
    settings = Settings(db_url=str(engine.url), poll_interval_s=0.05, artifacts_dir=tmp_path / "art")
    d = Dispatcher(settings, engine, FakeExecutor())
    d.start()
    try:
        ok = queue.submit(engine, fake_request(params={"ranks": 2, "artifact": True}))[0].id
        bad = queue.submit(engine, fake_request(params={"fail": True}))[0].id
        ended = ("succeeded", "failed")
        wait_until(lambda: (job_row(engine, ok).status, job_row(engine, bad).status) == ended, 20,
                   "ok succeeded, bad failed")
    finally:
        d.stop()
    job = job_row(engine, ok)
    assert job.info["device_name"] == "fake-cpu" and job.info["executor"] == "fake" and "commit" in job.info
    assert (job.progress_done, job.progress_total) == (2, 2)
    assert _n_samples(engine, ok) == 2 * 2 * 10 * 2  # cases x metrics x idx x ranks
    from service.persistence.artifacts import artifact_path

    assert artifact_path(tmp_path / "art", engine.url, ok, "report.txt").read_bytes() == b"fake report\n"
    assert job_row(engine, bad).error == "rank 0: asked to fail"
    with Session(engine) as s:
        kinds = [
            e.kind
            for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == ok).order_by(JobEventRow.id))
        ]
    assert kinds[:2] == ["status", "status"] and kinds[-1] == "status"
    assert {"info", "progress", "log", "artifact"} <= set(kinds)


def test_orphans_are_requeued_once_then_failed_with_the_reason(engine) -> None:
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dead_owner = f"{socket.gethostname()}:{dead.pid}:abc"
    live_owner = f"{socket.gethostname()}:{os.getpid()}:other"
    j1, j2, j3, j4 = (queue.submit(engine, fake_request())[0].id for _ in range(4))
    mark_running(engine, j1, dead_owner, attempts=1)
    mark_running(engine, j2, dead_owner, attempts=2)
    mark_running(engine, j3, live_owner, attempts=1)  # alive and fresh: left alone
    mark_running(engine, j4, "elsewhere:1:x", attempts=1, heartbeat_age_s=120)  # silent past the lease
    settled = dict(queue.settle_orphans(engine, "me", lease_s=30, max_attempts=2))
    assert settled == {j1: "queued", j2: "failed", j4: "queued"}
    assert job_row(engine, j3).status == "running"
    failed = job_row(engine, j2)
    assert failed.error.startswith("interrupted 2 time(s); last: its dispatcher (pid")
    assert failed.verdict == "errored" and failed.case_counts is not None  # not left null
    with Session(engine) as s:
        q = select(JobEventRow).where(JobEventRow.job_id == j1).order_by(JobEventRow.id.desc())
        reason = s.scalars(q).first()
    assert "re-queued after attempt 1 was interrupted" in reason.data["reason"]


DISPATCHER = textwrap.dedent("""
    import os, pathlib, sys, time
    from sqlalchemy import func, select
    from sqlalchemy.orm import Session
    from service.persistence import db
    from service.persistence.models import JobRow
    from service.dispatcher import Dispatcher
    from service.settings import Settings
    from tests.support.api_support import FakeExecutor
    settings = Settings(db_url=sys.argv[1], poll_interval_s=0.02, device_limits={"cpu": 3},
                        artifacts_dir=sys.argv[2])
    engine = db.make_engine(settings.db_url)
    d = Dispatcher(settings, engine, FakeExecutor())
    # start together: a process's imports take seconds, the queued jobs a fraction of that, so
    # without this the first one up could run every job before the other polls once
    (pathlib.Path(sys.argv[2]) / f"ready-{os.getpid()}").touch()
    start_by = time.monotonic() + 30
    while len(list(pathlib.Path(sys.argv[2]).glob("ready-*"))) < 2 and time.monotonic() < start_by:
        time.sleep(0.01)
    d.start()
    deadline = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < deadline:  # until no job is left to run (both processes see the same)
        time.sleep(0.1)
        with Session(engine) as s:
            if not s.scalar(select(func.count()).where(JobRow.status.in_(("queued", "running")))):
                break
    d.stop()
    print(d.owner)
""")


@pytest.mark.slow  # two dispatcher processes
def test_two_dispatcher_processes_never_run_a_job_twice(engine, tmp_path: Path) -> None:
    n = 50 if engine.dialect.name == "postgresql" else 30  # the issue asks 50 on PostgreSQL
    ids = [queue.submit(engine, fake_request(params={"cases": 1, "samples": 3}))[0].id for _ in range(n)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", DISPATCHER, str(engine.url), str(tmp_path), "60"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=90) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    owners = {o[0].strip() for o in outs}
    with Session(engine) as s:
        jobs = list(s.scalars(select(JobRow).where(JobRow.id.in_(ids))))
        runs = s.execute(
            select(JobEventRow.job_id, func.count())
            .where(JobEventRow.kind == "status", JobEventRow.message == "running")
            .group_by(JobEventRow.job_id)
        ).all()
        samples = dict(s.execute(select(SampleRow.job_id, func.count()).group_by(SampleRow.job_id)).all())
        claimed_by = {j.claimed_by for j in jobs}
    odd = [(j.id, j.status, j.attempts, j.error) for j in jobs if j.status != "succeeded" or j.attempts != 1]
    assert not odd, odd
    assert dict(runs) == {i: 1 for i in ids}  # every job started exactly once
    assert samples == {i: 1 * 2 * 3 for i in ids}  # and reported exactly one run's samples
    assert claimed_by <= owners and len(claimed_by) == 2, "both dispatchers should have taken work"


def test_a_claimed_job_waiting_for_resources_shows_queued_and_stays_its_dispatchers(engine) -> None:
    """An executor that waits for resources after the claim holds the job: it reads `queued`
    with its reason, no other dispatcher claims it, it counts against the device limit, its
    heartbeat, cancel, end and orphan settling treat it as the holder's, and it turns `running`
    when its ranks are placed."""
    import socket

    limits = {"cpu": 1, "cuda": 0, "npu": 0}
    held = queue.submit(engine, fake_request())[0].id
    other = queue.submit(engine, fake_request())[0].id
    assert queue.claim(engine, "d1", limits).id == held
    assert queue.hold(engine, held, "d1", "waiting for 3 x {'CPU': 1.0} (PACK): nodes asked for")
    assert not queue.hold(engine, held, "d2", "not mine")
    job = job_row(engine, held)
    assert (job.status, job.claimed_by) == ("queued", "d1")
    assert job.waiting_for == job.progress_message == "waiting for 3 x {'CPU': 1.0} (PACK): nodes asked for"
    assert job_row(engine, other).waiting_for is None  # queued, claimed by no one
    assert queue.claim(engine, "d2", {"cpu": 2, "cuda": 0, "npu": 0}).id == other  # never the held one
    assert queue.finish(engine, other, "d2", "succeeded")
    assert queue.claim(engine, "d2", limits) is None  # the held job takes the one cpu slot
    assert queue.heartbeat(engine, "d1", [held]) == set()
    assert queue.cancel(engine, held).cancel_requested and job_row(engine, held).status == "queued"
    assert queue.heartbeat(engine, "d1", [held]) == {held}  # the dispatcher hears the cancel
    assert queue.unhold(engine, held, "d1") and not queue.unhold(engine, held, "d1")
    job = job_row(engine, held)
    assert (job.status, job.waiting_for, job.progress_message) == ("running", None, "")
    assert queue.hold(engine, held, "d1", "again")
    assert queue.finish(engine, held, "d1", "cancelled")
    assert job_row(engine, held).waiting_for is None
    with Session(engine) as s:
        q = select(JobEventRow.message).where(JobEventRow.job_id == held, JobEventRow.kind == "status")
        assert list(s.scalars(q.order_by(JobEventRow.id))) == [
            "queued", "running", "queued", "cancel requested", "running", "queued", "cancelled"]

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = queue.submit(engine, fake_request())[0].id
    assert queue.claim(engine, f"{socket.gethostname()}:{dead.pid}:x", limits).id == orphan
    assert queue.hold(engine, orphan, f"{socket.gethostname()}:{dead.pid}:x", "nodes")
    assert dict(queue.settle_orphans(engine, "me", lease_s=30, max_attempts=2)) == {orphan: "queued"}
    job = job_row(engine, orphan)
    assert (job.claimed_by, job.waiting_for) == (None, None)
    assert queue.claim(engine, "me", limits).id == orphan
