"""Case results per attempt: a retried job keeps the cases its earlier run finished and shows,
counts and compares nothing else of that run, and a stale run that keeps reporting can neither
overwrite nor show its own.

The job is run through the real queue (claim, orphan settling, re-claim) and the dispatcher's
`StoreSink`; what is shown is read through the API, the job page, the jobs list and the gate.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.dispatcher import StoreSink
from service.domain import submission
from service.domain.baselines import load_side
from service.domain.gate import EXIT_FAIL, EXIT_PASS, GateRequest, evaluate_gate
from service.persistence import cases as case_store
from service.persistence import db, page_queries, queue, summaries
from service.persistence import samples as sample_store
from service.persistence.models import CaseResultRow, JobRow
from service.presentation import views
from service.presentation.gate_report import gate_markdown
from service.settings import Settings
from tests.support.api_support import FAKE
from tests.support.gate_runners import FakeRunner, gatetime_store
from workers.suite import Sample

pytestmark = pytest.mark.stores("sqlite")  # the `engine` of these tests is a SQLite file

LIMITS = {"cpu": 1}


def _samples(case: str, n: int = 6) -> list[Sample]:
    return [Sample(case, "time_ms", 10.0 + i, rank=0, idx=i) for i in range(n)]


def _retry(engine: Any, job_id: int) -> JobRow:
    """The first run's dispatcher dies (no heartbeat): settled, re-queued, claimed again."""
    with db.write_tx(engine) as s:
        s.execute(update(JobRow).where(JobRow.id == job_id)
                  .values(claimed_by="gone:1:dead", heartbeat_at=None))
    assert queue.settle_orphans(engine, "second", lease_s=60, max_attempts=3) == [(job_id, "queued")]
    job = queue.claim(engine, "second", LIMITS)
    assert job is not None and job.id == job_id and job.attempts == 2
    return job


def _client(engine: Any, tmp_path: Path) -> TestClient:
    from service.app import create_app

    return TestClient(create_app(Settings(db_url=str(engine.url), dispatch=False, executor="local",
                                          artifacts_dir=tmp_path / "artifacts")))


def _shown(client: TestClient, engine: Any, job_id: int) -> dict[str, Any]:
    """What every reader shows of the job's cases: API statuses, the job page's case counts, the
    jobs list's counts and verdict, the compare engine's (and so the gate's) statuses."""
    api = {c["name"]: c["status"] for c in client.get(f"/api/v1/jobs/{job_id}/cases").json()["items"]}
    page = client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    counts = re.search(r'aria-label="case outcomes">(.*?)</div>', page.text, re.S)
    assert counts is not None
    badges = re.findall(r'<span class="badge [^"]*">([^<]*)</span>', counts.group(1))
    with Session(engine) as s:
        job = s.get(JobRow, job_id)
        listed = page_queries.job_case_counts(s, [job_id]).get(job_id, {})
        compared = {c.name: c.status for c in load_side(s, job_id).cases.values()}
        verdict = views.job_verdict(job.status, job.verdict, listed)[0]
    rows = client.get("/jobs").text
    return {"api": api, "page": badges, "list": listed, "verdict": verdict, "compare": compared,
            "list_page": rows}


def _rows(engine: Any, job_id: int) -> list[tuple[int, str, str]]:
    with Session(engine) as s:
        q = (
            select(CaseResultRow.attempt, CaseResultRow.case_id, CaseResultRow.status)
            .where(CaseResultRow.job_id == job_id)
            .order_by(CaseResultRow.attempt, CaseResultRow.case_id)
        )
        return [tuple(r) for r in s.execute(q)]


def test_a_retried_job_shows_no_stale_statuses_and_a_stale_run_cannot_write_over_it(
    engine: Any, tmp_path: Path
) -> None:
    settings = Settings(db_url=str(engine.url), dispatch=False, executor="local")
    submitted = submission.submit_job(engine, settings, {"suite": FAKE, "params": {"cases": 3}}, None)
    job = queue.claim(engine, "first", LIMITS)
    assert job is not None and job.id == submitted.id and job.attempts == 1
    first = StoreSink(engine, job, tmp_path / "artifacts")
    c0, c1, c2 = (first.case_ids[n] for n in ("c0", "c1", "c2"))
    first.samples(_samples("c0"))
    first.case_result("c0", "passed")
    first.samples(_samples("c1"))
    first.case_result("c1", "failed", "rank 0: bound")
    assert _rows(engine, job.id) == [(1, c0, "passed"), (1, c1, "failed")]  # tagged with their run

    client = _client(engine, tmp_path)
    with client:
        before = _shown(client, engine, job.id)
        assert before["api"] == {"c0": "passed", "c1": "failed"} == before["compare"]
        assert before["list"] == {"passed": 1, "failed": 1}

        again = _retry(engine, job.id)
        # attempt 2 runs but has reported nothing: no case of attempt 1 is shown anywhere
        shown = _shown(client, engine, job.id)
        assert shown["api"] == {} and shown["compare"] == {} and shown["list"] == {}
        assert shown["page"] == []  # "0 cases:" and no status badge

        second = StoreSink(engine, again, tmp_path / "artifacts")
        # the new run keeps the cases the interrupted one finished, and runs only the rest
        assert second.kept == {"c0": 1, "c1": 1}
        assert _rows(engine, job.id) == [(2, c0, "passed"), (2, c1, "failed")]
        assert _shown(client, engine, job.id)["api"] == {"c0": "passed", "c1": "failed"}
        second.samples(_samples("c2"))  # c2 is running in attempt 2: no result yet
        shown = _shown(client, engine, job.id)
        assert shown["api"] == {"c0": "passed", "c1": "failed", "c2": None}

        # the interrupted run's dispatcher still reports: under attempt 1, never shown
        first.samples(_samples("c2"))
        first.case_result("c2", "passed")
        assert (1, c2, "passed") in _rows(engine, job.id)
        assert _shown(client, engine, job.id)["api"]["c2"] is None

        second.case_result("c2", "failed", "rank 0: bound 2")
        assert summaries.finish_summary(engine, job.id, 2) == 0  # every case stored its own at its end
        assert queue.finish(engine, job.id, "second", "succeeded")
        assert [r[0] for r in _rows(engine, job.id)] == [2, 2, 2]  # the stale run's rows are gone at the end
        # the job-level verdict counts attempt 2's cases (kept and run) only
        shown = _shown(client, engine, job.id)
        assert shown["list"] == {"failed": 2, "passed": 1}
        assert shown["verdict"] == "failed (2 of 3 cases)"
        assert "failed (2 of 3 cases)" in shown["list_page"]
        assert shown["api"] == {"c0": "passed", "c1": "failed", "c2": "failed"} == shown["compare"]
        cases = client.get(f"/api/v1/jobs/{job.id}/cases").json()["items"]
        assert [c["error"] for c in cases] == [None, "rank 0: bound", "rank 0: bound 2"]


A, B, E = "a" * 40, "b" * 40, "e" * 40


@pytest.fixture
def gate_env(tmp_path: Path) -> Iterator[tuple[Any, FakeRunner]]:
    with pytest.MonkeyPatch.context() as mp, gatetime_store(f"sqlite:///{tmp_path / 'gate.db'}", mp) as eng:
        yield eng, FakeRunner(eng)


def _gate(env: tuple[Any, FakeRunner], head: str) -> Any:
    return evaluate_gate(env[0], GateRequest(head=head, base=A, suites=["gatetime"]), env[1])


def _rerun(engine: Any, job_id: int, latest: str | None, stale: str) -> None:
    """The job ran again as attempt 2 (same samples, status `latest`, None: not reported); then
    its interrupted attempt 1 reported the case once more as `stale`."""
    boom = "Traceback\nRuntimeError: boom"
    with db.write_tx(engine) as s:
        s.get(JobRow, job_id).attempts = 2
        ((cid,),) = s.execute(select(CaseResultRow.case_id).where(CaseResultRow.job_id == job_id)).all()
        case_store.drop_earlier_case_results(s, job_id, 2)
        if latest is not None:
            case_store.set_case_result(s, job_id, cid, latest, boom if latest == "error" else None, attempt=2)
    rows = [(v.case_id, v.metric_id, v.rank, v.idx, v.value) for v in _samples_of(engine, job_id)]
    sample_store.insert_samples(engine, job_id, rows, attempt=2)
    with db.write_tx(engine) as s:
        case_store.set_case_result(s, job_id, cid, stale, boom if stale == "error" else None, attempt=1)


def _samples_of(engine: Any, job_id: int) -> list[Any]:
    from service.persistence.models import SampleRow

    with Session(engine) as s:
        return list(s.scalars(select(SampleRow).where(SampleRow.job_id == job_id, SampleRow.attempt == 1)))


def test_the_gate_judges_only_the_latest_attempts_case_status(gate_env: tuple[Any, FakeRunner]) -> None:
    engine = gate_env[0]
    first = _gate(gate_env, B)
    assert first.exit_code == EXIT_PASS, gate_markdown(first)
    head_b = next(j.job_id for j in first.jobs if j.role == "head")
    _rerun(engine, head_b, latest="error", stale="passed")  # a stale "passed" must not hide the error
    errored = _gate(gate_env, B)
    assert errored.exit_code == EXIT_FAIL, gate_markdown(errored)
    assert [c.verdict for c in errored.comparisons[0].cases] == ["errored"]

    ok = _gate(gate_env, E)
    head_e = next(j.job_id for j in ok.jobs if j.role == "head")
    # nor does a stale "error" fail a run whose attempt 2 has samples and no status of its own
    # (compare counts such a case as passed; reading attempt 1's row would make it errored)
    _rerun(engine, head_e, latest=None, stale="error")
    again = _gate(gate_env, E)
    assert again.exit_code == EXIT_PASS, gate_markdown(again)
    assert [j.job_id for j in again.jobs if j.role == "head"] == [head_e]  # the same, reused job
    assert [c.head_status for c in again.comparisons[0].cases] == ["passed"]
