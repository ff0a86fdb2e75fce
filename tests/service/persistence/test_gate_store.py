"""Gates as stored entities and the backend commit as the code under test, over the real store:
a gate's row records its request, jobs, confirmation pairs, verdict and the reason per metric
(read back through the API and the pages); a job running a backend from another repository
shows and is found by that backend's commit. Jobs are "run" by the gate tests' fake runner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.app import create_app
from service.domain.gate import EXIT_FAIL, EXIT_INFRA, GateRequest, evaluate_gate
from service.persistence import gates as gate_store
from service.persistence import jobs as job_store
from service.persistence import queue
from service.persistence.models import GateRow, JobRow
from service.settings import Settings
from tests.support.gate_runners import UB, B, C, FakeRunner, U, gatetime_store, sleep_metric

BACKEND_SHA = "c0ffee" + "1" * 34


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[str, Any, FakeRunner]]:
    url = f"sqlite:///{tmp_path / 'gate.db'}"
    with pytest.MonkeyPatch.context() as mp, gatetime_store(url, mp) as engine:
        yield url, engine, FakeRunner(engine)


def test_a_gate_is_stored_with_its_jobs_confirmations_verdict_and_reasons(store) -> None:
    url, engine, runner = store
    req = GateRequest(head=C, base=B, suites=["gatetime"], run_id="slow-c")
    runner.run_now = False
    waiting = evaluate_gate(engine, req, runner)
    with Session(engine) as s:
        (row,) = gate_store.list_gates(s)[0]
        assert (row.id, row.phase, row.verdict, row.run_id) == (waiting.gate_id, "waiting", None, "slow-c")
    for job_id in list(runner.submitted):
        runner.run(job_id)
    runner.run_now = True
    state = evaluate_gate(engine, req, runner)  # confirms on cpu: a fresh pair, run at once
    state = evaluate_gate(engine, req, runner)
    assert state.exit_code == EXIT_FAIL and state.gate_id == waiting.gate_id
    with Session(engine) as s:
        row = s.get(GateRow, state.gate_id)
        assert (row.phase, row.verdict, row.exit_code, row.head, row.base) == ("done", "fail", 1, C, B)
        assert row.request["suites"] == ["gatetime"] and row.finished_at is not None
        (finding,) = [f for f in row.findings if f["metric"] == "sleep_ms"]
        assert (finding["verdict"], finding["reason"]) == ("regressed", sleep_metric(state).reason)
        assert finding["head_job"] == state.comparisons[0].head.job_id
        assert [c["confirmed"] for c in row.confirmations] == [True]
        roles = [link.role for link in gate_store.gate_jobs(s, row.id)]
        assert roles == ["head", "base", "confirm-base", "confirm"]
        assert len(gate_store.list_gates(s)[0]) == 1  # one row per gate run, updated at each step

    with TestClient(create_app(Settings(db_url=url, dispatch=False, executor="local"))) as client:
        api = client.get(f"/api/v1/gates/{state.gate_id}").json()
        assert (api["verdict"], api["exit_code"], api["rounds"]) == ("fail", 1, 0)
        assert [j["role"] for j in api["jobs"]] == roles
        assert {j["code_commit"] for j in api["jobs"]} == {B, C}
        assert api["findings"] == row.findings and api["confirmations"][0]["confirmed"] is True
        listed = client.get("/api/v1/gates").json()
        assert [g["id"] for g in listed["items"]] == [state.gate_id]
        assert [j["role"] for j in listed["items"][0]["jobs"]] == roles
        assert client.get("/api/v1/gates/999").status_code == 404
        page = client.get(f"/gates/{state.gate_id}").text
        assert 'data-gate-verdict="fail"' in page and "sleep_ms" in page and "yes (confirmed)" in page
        assert all(f'href="/jobs/{j["job_id"]}"' in page for j in api["jobs"])
        assert f'href="/gates/{state.gate_id}"' in client.get("/gates").text
        jobs_page = client.get("/jobs").text  # every job the gate ran links it, with its verdict
        assert jobs_page.count(f'href="/gates/{state.gate_id}"') == len(api["jobs"])
        assert f'href="/gates/{state.gate_id}"' in client.get(f"/jobs/{api['jobs'][0]['job_id']}").text
        assert client.get("/gates/999").status_code == 404


def test_a_gate_whose_confirmation_is_undecided_is_stored_and_shown_as_such(store) -> None:
    url, engine, runner = store
    req = GateRequest(head=U, base=UB, suites=["gatetime"], max_rounds=0, run_id="undecided-u")
    state = evaluate_gate(engine, req, runner)
    assert state.exit_code == EXIT_INFRA, state.reason
    with Session(engine) as s:
        row = s.get(GateRow, state.gate_id)
        assert (row.verdict, row.exit_code, row.undecided) == ("error", 2, ["gatetime/sleep"])
        (conf,) = row.confirmations
        assert (conf["rerun_verdict"], conf["outcome"]) == ("inconclusive", "undecided")
        assert conf["confirmed"] is False
        (finding,) = [f for f in row.findings if f["metric"] == "sleep_ms"]
        assert finding["verdict"] == "inconclusive" and "neither confirmed nor cleared" in finding["reason"]
    with TestClient(create_app(Settings(db_url=url, dispatch=False, executor="local"))) as client:
        page = client.get(f"/gates/{state.gate_id}").text
        assert 'data-gate-verdict="error"' in page and "undecided (neither confirmed nor cleared)" in page


def test_a_backend_jobs_commit_is_the_backends_shown_and_found(store) -> None:
    from service.dispatcher import StoreSink

    url, engine, _ = store
    labels = {"backend_source": f"git+/srv/mykernel@{BACKEND_SHA}"}
    job, _ = queue.submit(engine, queue.JobRequest(suite="gatetime", preset="quick", labels=labels))
    at_main = {"backend_source": "git+/r@main"}
    branch, _ = queue.submit(engine, queue.JobRequest(suite="gatetime", labels=at_main))
    ours, _ = queue.submit(engine, queue.JobRequest(suite="gatetime", commit=B))
    with Session(engine) as s:
        assert s.get(JobRow, job.id).code_commit == BACKEND_SHA and s.get(JobRow, job.id).commit_sha is None
        assert s.get(JobRow, branch.id).code_commit is None  # a branch is known once installed
        assert s.get(JobRow, ours.id).code_commit == B
        assert [j.id for j in job_store.list_jobs(s, commit=BACKEND_SHA[:8])[0]] == [job.id]
        assert [j.id for j in job_store.list_jobs(s, commit=B[:8])[0]] == [ours.id]
        q = {"statuses": ("queued",)}
        assert job_store.find_commit_job(s, BACKEND_SHA[:7], "gatetime", **q).id == job.id
        assert job_store.find_commit_job(s, BACKEND_SHA, "gatetime", backend=True, **q).id == job.id
        assert job_store.find_commit_job(s, BACKEND_SHA, "gatetime", backend=False, **q) is None
        sink = StoreSink(engine, s.get(JobRow, branch.id), Path(url.removeprefix("sqlite:///")).parent)
    resolved = "ab" * 20
    sink.info({"backends": [{"backend": "eager", "distribution": "gdnval", "commit": "f" * 40},
                            {"backend": "mk", "distribution": "mykernel", "commit": resolved}]})
    with Session(engine) as s:
        assert s.get(JobRow, branch.id).code_commit == resolved
    with TestClient(create_app(Settings(db_url=url, dispatch=False, executor="local"))) as client:
        page = client.get("/jobs").text
        assert f">{BACKEND_SHA[:10]}</a>" in page and f">{resolved[:10]}</a>" in page
        found = client.get("/api/v1/jobs", params={"commit": BACKEND_SHA[:9]}).json()["items"]
        assert [(j["id"], j["code_commit"], j["commit"]) for j in found] == [(job.id, BACKEND_SHA, None)]
        assert "backend commit" in client.get(f"/jobs/{job.id}").text


def test_gate_pages_and_api_are_read_protected_like_the_others(tmp_path: Path) -> None:
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'web.db'}", api_token="s3cret", protect_reads=True,
                        dispatch=False, executor="local", artifacts_dir=tmp_path / "a")
    with TestClient(create_app(settings), follow_redirects=False) as client:
        for path in ("/gates", "/gates/1"):
            assert client.get(path).status_code == 303, path  # to the login page
        assert client.get("/api/v1/gates").status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert client.get("/api/v1/gates", headers=auth).json() == {"items": [], "next": None}
        assert client.get("/api/v1/gates/1", headers=auth).status_code == 404
