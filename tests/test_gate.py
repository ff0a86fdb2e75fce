"""The gate end to end on CPU: real store, real dispatcher, local executor on commit snapshots.

A temporary git repository holds the project's runtime code plus the test-only `gatetime` suite
(tests/gate_suite_for_tests.py) over four commits: A, B (timing unchanged), C (the suite's
`SLOW_FACTOR` raised: a planted slow-down), D (timing unchanged, for the noisy-run case). Each job
runs on its commit's snapshot, so the head's code really is slower.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from service.gate import (
    EXIT_FAIL,
    EXIT_INFRA,
    EXIT_PASS,
    GateInputError,
    GateRequest,
    GateState,
    default_submit,
    evaluate_gate,
)

ROOT = Path(__file__).resolve().parent.parent
SUITE_MODULE = "tests.gate_suite_for_tests"


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=gate@example.com", "-c", "user.name=gate", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def make_repo(path: Path) -> dict[str, str]:
    """The runtime's code (gdn, kernels, workers) and the gatetime suite, committed four times."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("gdn", "kernels", "workers"):
        shutil.copytree(ROOT / pkg, path / pkg, ignore=ignore)
    (path / "tests").mkdir()
    (path / "tests" / "__init__.py").write_text("")
    suite_src = (ROOT / "tests" / "gate_suite_for_tests.py").read_text()
    assert "SLOW_FACTOR = 1.0" in suite_src
    (path / "tests" / "gate_suite_for_tests.py").write_text(suite_src)
    _git(path, "init", "-q")
    shas: dict[str, str] = {}

    def commit(name: str) -> None:
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", name)
        shas[name] = _git(path, "rev-parse", "HEAD")

    commit("A")
    (path / "NOTES.txt").write_text("B: a change that does not touch timing\n")
    commit("B")
    (path / "tests" / "gate_suite_for_tests.py").write_text(
        suite_src.replace("SLOW_FACTOR = 1.0", "SLOW_FACTOR = 1.5")
    )
    commit("C")
    (path / "tests" / "gate_suite_for_tests.py").write_text(suite_src)
    commit("D")
    return shas


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    from service.db import make_engine, upgrade
    from service.dispatcher import Dispatcher
    from service.settings import Settings
    from workers.executors.local import LocalExecutor
    from workers.registry import SUITE_MODULES, get_suite

    tmp = tmp_path_factory.mktemp("gate")
    repo = tmp / "repo"
    repo.mkdir()
    shas = make_repo(repo)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(SUITE_MODULES, "gatetime", SUITE_MODULE)
        get_suite.cache_clear()
        url = f"sqlite:///{tmp / 'gate.db'}"
        engine = make_engine(url)
        upgrade(engine)
        # lease 60 s: the dispatcher writes heartbeats less often while jobs start
        settings = Settings(db_url=url, artifacts_dir=tmp / "artifacts", poll_interval_s=1.0, lease_s=60.0)
        executor = LocalExecutor(repo=repo, cache_dir=tmp / "snapshots", poll_s=0.05)
        dispatcher = Dispatcher(settings, engine, executor)
        dispatcher.start()
        try:
            yield SimpleNamespace(
                engine=engine, dispatcher=dispatcher, shas=shas, repo=repo, tmp=tmp, mp=mp, settings=settings,
                executor=executor,
            )
        finally:
            dispatcher.stop()
            engine.dispose()
            get_suite.cache_clear()


def run_gate(svc: SimpleNamespace, timeout: float = 150.0, **kw: object) -> GateState:
    """Step the gate until done, as the CLI does through the API."""
    req = GateRequest(suites=["gatetime"], **kw)
    deadline = time.monotonic() + timeout
    submit = default_submit(svc.engine, svc.settings, svc.executor, svc.dispatcher.wake)
    while True:
        state = evaluate_gate(svc.engine, req, submit)
        if state.phase == "done":
            return state
        assert time.monotonic() < deadline, f"gate still waiting: {state.reason} {state.jobs}"
        time.sleep(0.25)


def time_metric(state: GateState):
    (cmp,) = state.comparisons
    (case,) = cmp.cases
    return next(m for m in case.metrics if m.metric == "sleep_ms")


@pytest.mark.slow
def test_unchanged_pair_passes_and_reuses_jobs(service: SimpleNamespace) -> None:
    a, b = service.shas["A"], service.shas["B"]
    state = run_gate(service, head=b, base=a, run_id="t1")
    assert state.exit_code == EXIT_PASS, state.markdown
    assert state.verdict == "pass"
    # sleep timings on a shared CPU may be too noisy for "unchanged"; they must never "regress"
    assert time_metric(state).verdict in ("unchanged", "inconclusive", "improved")
    assert {j.role for j in state.jobs} == {"head", "base"}
    assert all(j.status == "succeeded" for j in state.jobs)
    assert "✅ PASS" in state.markdown and "/jobs/" in state.markdown
    # A second gate run of the same pair reuses both jobs instead of running them again.
    again = run_gate(service, head=b, base=a, run_id="t1-again")
    assert [j.job_id for j in again.jobs] == [j.job_id for j in state.jobs]
    assert all(j.reused for j in again.jobs)


@pytest.mark.slow
def test_planted_slowdown_fails_with_exit_1(service: SimpleNamespace) -> None:
    b, c = service.shas["B"], service.shas["C"]
    state = run_gate(service, head=c, base=b, run_id="t2")
    assert state.exit_code == EXIT_FAIL, state.markdown
    m = time_metric(state)
    assert m.verdict == "regressed" and m.ratio > 1.3 and m.p_value < 0.01
    assert "❌ FAIL" in state.markdown and "regressed" in state.markdown
    data = state.to_dict()
    assert data["exit_code"] == 1 and data["comparisons"][0]["passed"] is False


@pytest.mark.slow
def test_confirm_turns_a_one_off_noisy_run_into_a_pass(service: SimpleNamespace) -> None:
    b, d = service.shas["B"], service.shas["D"]
    flag = service.tmp / "noise-once"
    flag.write_text("slow once")
    service.mp.setenv("GDNVAL_TEST_NOISE_FILE", str(flag))
    state = run_gate(service, head=d, base=b, confirm=True, run_id="t3")
    assert not flag.exists()  # the head's first run consumed it
    assert state.exit_code == EXIT_PASS, state.markdown
    (conf,) = state.confirmations
    assert not conf.confirmed and conf.rerun_verdict != "regressed"
    assert "regressed" not in {m.verdict for cmp in state.comparisons for c in cmp.cases for m in c.metrics}
    assert "not reproduced" in state.markdown
    assert [j.role for j in state.jobs].count("confirm") == 1


@pytest.mark.slow
def test_confirm_keeps_a_real_regression(service: SimpleNamespace) -> None:
    b, c = service.shas["B"], service.shas["C"]
    state = run_gate(service, head=c, base=b, confirm=True, run_id="t4")
    assert state.exit_code == EXIT_FAIL, state.markdown
    (conf,) = state.confirmations
    assert conf.confirmed


def test_executor_that_cannot_run_gives_exit_2(service: SimpleNamespace) -> None:
    a, b = service.shas["A"], service.shas["B"]
    state = run_gate(service, head=b, base=a, world_size=64, run_id="t5")
    assert state.exit_code == EXIT_INFRA and state.verdict == "error"
    assert "could not run" in state.reason and "world_size 64" in state.reason
    assert state.jobs == []  # refused at submission: nothing queued that could never run
    assert "COULD NOT RUN" in state.markdown


def test_unknown_commit_gives_exit_2(service: SimpleNamespace) -> None:
    state = run_gate(service, head="f" * 40, base=service.shas["A"], run_id="t6")
    assert state.exit_code == EXIT_INFRA and "snapshot" in state.reason


def test_bad_requests_name_the_problem(service: SimpleNamespace) -> None:
    with pytest.raises(GateInputError, match="unknown suite 'nope'"):
        evaluate_gate(service.engine, GateRequest(head="x", base="y", suites=["nope"]))
    with pytest.raises(GateInputError, match="unknown preset 'huge'"):
        evaluate_gate(service.engine, GateRequest(head="x", base="y", suites=["gatetime"], preset="huge"))
    state = evaluate_gate(service.engine, GateRequest(head="0" * 40, suites=["gatetime"]))
    assert state.exit_code == EXIT_INFRA and "give --base or --baseline" in state.reason
