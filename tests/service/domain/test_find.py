"""`find` over the real store and a real git repository: the first-parent range bisected with
the gate's own judgment (every step a stored gate), the bad end checked first, skipped commits
(their jobs fail) stepped over, the boundary measured anew before a commit is named, at most
ceil(log2 N) + 2 commits measured, and the find stored with its steps, API and pages. Jobs are
"run" by the history tests' runner (the `gatetime` suite, a planted 1.3x slow-down); the real
executor path is tests/e2e/test_find.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.domain.find import FindRequest, evaluate_find, measured_bound, next_step
from service.domain.gate import GateRequest
from service.settings import Settings
from tests.support.gate_runners import TimedRunner, gatetime_store
from tests.support.gate_suite import git

NAMES = [f"c{i}" for i in range(9)]  # c0 good ... c8; c5 and later 1.3x slower


@pytest.fixture
def env(tmp_path: Path) -> Iterator[SimpleNamespace]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    shas: dict[str, str] = {}
    for name in NAMES:
        (repo / "code.txt").write_text(name)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"{name}: a change")
        shas[name] = git(repo, "rev-parse", "HEAD")
    url = f"sqlite:///{tmp_path / 'find.db'}"
    with pytest.MonkeyPatch.context() as mp, gatetime_store(url, mp) as engine:
        mp.setenv("GDNVAL_REPO", str(repo))
        slow = {shas[n]: 1.3 for n in NAMES[5:]}
        yield SimpleNamespace(shas=shas, engine=engine, url=url, slow=slow, runner=TimedRunner(engine, slow))


def request(env: SimpleNamespace, good: str, bad: str, listed: bool = True, **gate: Any) -> FindRequest:
    """The find of good..bad; `listed`: the commits given (as the CLI sends them), else the
    service lists them in its repository."""
    names = NAMES[NAMES.index(good) + 1:NAMES.index(bad) + 1]
    return FindRequest(gate=GateRequest(head=env.shas[bad], base=env.shas[good], suites=["gatetime"], **gate),
                       commits=[env.shas[n] for n in names] if listed else [], run_id=f"{good}-{bad}")


def names(env: SimpleNamespace, shas: list[str]) -> list[str]:
    by_sha = {v: k for k, v in env.shas.items()}
    return [by_sha[s] for s in shas]


def test_bisection_names_the_first_bad_commit_within_its_bound(env) -> None:
    found = evaluate_find(env.engine, request(env, "c0", "c8"), env.runner)
    assert (found.phase, found.exit_code, found.verdict) == ("done", 1, "fail"), found.reason
    assert (found.first_bad, found.last_good) == (env.shas["c5"], env.shas["c4"])
    steps = [(st.kind, names(env, [st.commit])[0], st.outcome) for st in found.steps]
    assert steps[0] == ("verify", "c8", "bad") and steps[-1] == ("confirm", "c5", "bad")
    assert [s for s in steps if s[0] == "bisect"] == [("bisect", "c4", "good"), ("bisect", "c6", "bad"),
                                                      ("bisect", "c5", "bad")]
    assert len(found.measured) <= measured_bound(8) == 5
    assert set(names(env, found.measured)) == {"c0", "c8", "c4", "c6", "c5"}
    assert {(f["metric"], f["verdict"]) for f in found.findings} == {("sleep_ms", "regressed")}
    before = len(env.runner.submitted)
    again = evaluate_find(env.engine, request(env, "c0", "c8"), env.runner)
    assert len(env.runner.submitted) == before and again.first_bad == found.first_bad
    assert again.find_id == found.find_id and len(again.steps) == len(found.steps) and not again.jobs


def test_a_find_waits_for_its_jobs_step_by_step(env) -> None:
    env.runner.hold = True
    req = request(env, "c0", "c8", confirm=False)
    state = evaluate_find(env.engine, req, env.runner)
    for _ in range(20):
        if state.phase == "done":
            break
        assert state.jobs and state.reason.startswith(("verify", "bisect", "confirm"))
        for job_id in list(env.runner.submitted):
            env.runner.run(job_id)
        env.runner.submitted.clear()
        state = evaluate_find(env.engine, req, env.runner)
    assert (state.exit_code, state.first_bad) == (1, env.shas["c5"])


def test_no_regression_and_the_range_from_the_service_repository(env) -> None:
    clean = evaluate_find(env.engine, request(env, "c0", "c4", listed=False), env.runner)
    assert (clean.exit_code, clean.verdict, clean.first_bad) == (0, "pass", None)
    assert [st.kind for st in clean.steps] == ["verify"] and "no regression" in clean.reason
    assert names(env, clean.commits) == ["c1", "c2", "c3", "c4"]


def test_commits_that_cannot_be_built_are_skipped(env) -> None:
    env.runner.broken = frozenset({env.shas["c4"]})
    state = evaluate_find(env.engine, request(env, "c0", "c8", confirm=False), env.runner)
    outcome = {names(env, [st.commit])[0]: st.outcome for st in state.steps if st.kind == "bisect"}
    assert outcome["c4"] == "skip" and state.exit_code == 2 and state.first_bad is None
    assert f"one of {env.shas['c4'][:12]}, {env.shas['c5'][:12]}" in state.reason


def test_next_step_is_the_middle_of_what_is_open() -> None:
    commits = list("abcdefgh")
    assert next_step("z", commits, {}).commit == "h"  # the bad end first
    assert next_step("z", commits, {"h": "bad"}).commit == "d"
    assert next_step("z", commits, {"h": "bad", "d": "skip"}).commit == "c"  # nearest the middle, lower first
    done = next_step("z", commits, {"h": "bad", "d": "good", "e": "bad"})
    assert (done.kind, done.commit, done.base) == ("confirm", "e", "d")
    assert next_step("z", commits, {"h": "bad", "d": "good", "e": "bad"}, "good").code == 2
    assert next_step("z", commits, {"h": "good"}).code == 0
    assert [measured_bound(n) for n in (1, 2, 4, 5, 8, 1000)] == [2, 3, 4, 5, 5, 12]


def test_a_find_through_the_api_and_its_pages(env) -> None:
    req = request(env, "c0", "c8")
    found = evaluate_find(env.engine, req, env.runner)
    settings = Settings(db_url=env.url, dispatch=False, executor="local")
    with TestClient(create_app(settings)) as client:
        again = client.post("/api/v1/find", json=req.model_dump(mode="json")).json()
        assert (again["phase"], again["exit_code"], again["first_bad"]) == ("done", 1, env.shas["c5"])
        assert f"first bad commit: `{env.shas['c5']}`" in again["markdown"]
        assert "sleep_ms" in again["markdown"]
        listed = client.get("/api/v1/finds", params={"verdict": "fail", "head": env.shas["c8"][:7]}).json()
        (item,) = listed["items"]
        assert item["id"] == found.find_id and item["steps"][0]["kind"] == "verify"
        assert all(s["jobs"] for s in item["steps"]) and item["measured"] == found.measured
        assert client.get("/api/v1/finds", params={"verdict": "pass"}).json()["items"] == []
        page = client.get(f"/finds/{found.find_id}").text
        assert env.shas["c5"] in page and page.count('<tr data-commit="') == len(found.steps)
        assert 'data-metric="sleep_ms" data-verdict="regressed"' in page
        assert f'href="/finds/{found.find_id}"' in client.get("/finds").text
        job = item["steps"][-1]["jobs"][0]["job_id"]
        assert f'href="/finds/{found.find_id}"' in client.get(f"/jobs/{job}").text  # linked from its jobs
        wrong = req.model_dump(mode="json")
        wrong["commits"] = wrong["commits"][:-1]
        refused = client.post("/api/v1/find", json=wrong)
        assert refused.status_code == 422 and "expected the bad commit" in refused.text
        unreadable = req.model_dump(mode="json")
        unreadable["commits"] = []
        unreadable["gate"].update(backend_repo="no-such-backend-repo", backend="toy")
        refused = client.post("/api/v1/find", json=unreadable)  # the service lists the range: cannot
        assert refused.status_code == 422 and "cannot fetch backend repository" in refused.text, refused.text


def test_code_under_test_matches_only_a_job_that_ran_exactly_it() -> None:
    """What a job records of its code (`info.code_hash`, each backend's content) against what a
    commit's jobs would record: ours alone, or ours and the backend under test."""
    from service.domain.same_code import CodeUnderTest

    ours = {"backend": "eager", "distribution": "gdnval", "content_hash": "t"}
    project = CodeUnderTest("t")
    assert project.measured_by({"code_hash": "t", "backends": [ours]})
    assert project.measured_by({"code_hash": "t"})  # a suite that names no backend
    assert not project.measured_by({"code_hash": "u", "backends": [ours]})
    fla = {"backend": "fla", "distribution": "flash-linear-attention", "content_hash": "f"}
    assert not project.measured_by({"code_hash": "t", "backends": [ours, fla]})  # not ours: unknown here
    backend = CodeUnderTest("t", "extgdn", "x")
    ext = {"backend": "extgdn", "distribution": "ext-gdn", "content_hash": "x"}
    assert backend.measured_by({"code_hash": "t", "backends": [ours, ext]})
    assert not backend.measured_by({"code_hash": "t", "backends": [ours, {**ext, "content_hash": "y"}]})
    assert not backend.measured_by({"code_hash": "t", "backends": [ours]})  # never ran the backend
