"""The gate's decisions over the real store, with jobs "run" by a fake runner that writes
synthetic samples at submission (fast; the real executor path is tests/service/cli/test_gate_http.py).

Commit timings are known: `SLOW` commits are 30% slower, `NOISY_ONCE` commits are slow on their
first run only, `BROKEN` commits fail as a job (a rank died: the infrastructure), and
`LOADED_ON_CONFIRM` commits are quiet in their first jobs but noisy in their confirmation jobs
(the machine got busy after the first pair).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from service.domain.compare import VERDICTS
from service.domain.gate import (
    EXIT_FAIL,
    EXIT_INFRA,
    EXIT_PASS,
    GateInputError,
    GateRequest,
    GateState,
    confirmation_outcome,
    evaluate_gate,
)
from service.persistence import baselines
from service.persistence import commits as commit_store
from service.persistence.models import CommitRow, JobRow
from service.presentation.gate_report import gate_markdown
from tests.support.gate_runners import (
    NB,
    UB,
    A,
    B,
    C,
    D,
    E,
    F,
    FakeRunner,
    N,
    R,
    U,
    X,
    gatetime_store,
    sleep_metric,
)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Any, FakeRunner]]:
    url = f"sqlite:///{tmp_path / 'gate.db'}"
    with pytest.MonkeyPatch.context() as mp, gatetime_store(url, mp) as engine:
        yield engine, FakeRunner(engine)


def gate(env: tuple[Any, FakeRunner], **kw: Any) -> GateState:
    engine, runner = env
    return evaluate_gate(engine, GateRequest(suites=["gatetime"], **kw), runner)


def test_unchanged_pair_passes_and_a_second_gate_reuses_the_jobs(env) -> None:
    state = gate(env, head=B, base=A, run_id="r1")
    assert state.exit_code == EXIT_PASS and state.verdict == "pass", gate_markdown(state)
    assert sleep_metric(state).verdict == "unchanged"
    assert [j.role for j in state.jobs] == ["head", "base"] and not any(j.reused for j in state.jobs)
    again = gate(env, head=B, base=A, run_id="r2")
    assert again.exit_code == EXIT_PASS
    assert all(j.reused for j in again.jobs) and len(env[1].submitted) == 2


def test_planted_slowdown_fails(env) -> None:
    state = gate(env, head=C, base=B)
    assert state.exit_code == EXIT_FAIL and state.verdict == "fail"
    m = sleep_metric(state)
    assert m.verdict == "regressed" and 1.25 < m.ratio < 1.35 and m.p_value < 0.01
    assert "gatetime/sleep (regressed)" in state.reason
    assert "❌ FAIL" in gate_markdown(state) and "🔴 regressed" in gate_markdown(state)
    d = state.to_dict()
    assert d["exit_code"] == 1 and d["comparisons"][0]["counts"]["regressed"] == 1


def test_confirm_ignores_a_one_off_slow_run_and_keeps_a_real_regression(env) -> None:
    noisy = gate(env, head=D, base=B, confirm=True)
    assert noisy.exit_code == EXIT_PASS, gate_markdown(noisy)
    (conf,) = noisy.confirmations
    assert not conf.confirmed and conf.rerun_verdict == "unchanged"
    assert sleep_metric(noisy).verdict == "changed" and "not confirmed" in sleep_metric(noisy).reason
    assert [j.role for j in noisy.jobs] == ["head", "base", "confirm-base", "confirm"]  # both re-measured
    assert conf.first_reason.startswith("median +3")  # the first run did regress by ~30%
    # a later gate of D reuses D's newest job: the re-run, not the noisy first run
    assert gate(env, head=D, base=B).exit_code == EXIT_PASS
    real = gate(env, head=C, base=B, confirm=True)
    assert real.exit_code == EXIT_FAIL and real.confirmations[0].confirmed
    assert "yes (confirmed)" in gate_markdown(real)


def test_waiting_until_jobs_finish(env) -> None:
    runner = env[1]
    runner.run_now = False
    first = gate(env, head=B, base=A, run_id="w")
    assert first.phase == "waiting" and first.exit_code is None and len(runner.submitted) == 2
    second = gate(env, head=B, base=A, run_id="w")  # same run: no new jobs
    assert second.phase == "waiting" and len(runner.submitted) == 2
    for job_id in runner.submitted:
        runner.run(job_id)
    assert gate(env, head=B, base=A, run_id="w").exit_code == EXIT_PASS


def test_a_failed_job_means_could_not_run(env) -> None:
    state = gate(env, head=X, base=A)
    assert state.exit_code == EXIT_INFRA and state.verdict == "error"
    assert "head job" in state.reason and "SIGKILL" in state.reason
    assert "COULD NOT RUN" in gate_markdown(state)


def test_cancelled_base_job_means_could_not_run(env) -> None:
    engine, runner = env
    runner.run_now = False
    gate(env, head=B, base=A, run_id="c")
    with Session(engine) as s, s.begin():
        s.execute(update(JobRow).where(JobRow.id == runner.submitted[1]).values(status="cancelled"))
    state = gate(env, head=B, base=A, run_id="c")
    assert state.exit_code == EXIT_INFRA and "base job" in state.reason and "cancelled" in state.reason


def test_baselines_parents_and_job_bases(env) -> None:
    engine = env[0]
    first = gate(env, head=B, base=A)
    base_job = next(j.job_id for j in first.jobs if j.role == "base")
    with Session(engine) as s, s.begin():
        baselines.set_baseline(s, "main", commit=A)
        s.execute(update(CommitRow).where(CommitRow.sha == C).values(parent=B))
        commit_store.ensure_commit(s, E, parent=A)
    named = gate(env, head=B, baseline="main")
    assert named.exit_code == EXIT_PASS and "baseline 'main'" in named.base_source
    by_job = gate(env, head=C, base=f"job:{base_job}")
    assert by_job.exit_code == EXIT_FAIL and by_job.jobs[1].job_id == base_job
    parent = gate(env, head=E)  # no repository: the parent the store recorded
    assert parent.base == A and "recorded in the store" in parent.base_source
    assert parent.exit_code == EXIT_PASS
    missing = gate(env, head=B, base="job:999")
    assert missing.exit_code == EXIT_INFRA and "base job 999 does not exist" in missing.reason


def test_bad_requests_name_the_problem(env) -> None:
    engine, runner = env
    with pytest.raises(GateInputError, match="unknown suite 'nope'"):
        evaluate_gate(engine, GateRequest(head=B, base=A, suites=["nope"]), runner)
    with pytest.raises(GateInputError, match="unknown preset 'huge'"):
        gate(env, head=B, base=A, preset="huge")
    state = gate(env, head="0" * 40)
    assert state.exit_code == EXIT_INFRA and "give --base or --baseline" in state.reason
    with pytest.raises(GateInputError, match="not both"):
        gate(env, head=B, base=A, baseline="main")
    assert runner.submitted == []


def test_everything_is_validated_before_a_job_is_queued(env) -> None:
    engine, runner = env
    with pytest.raises(GateInputError, match="unknown parameter"):
        gate(env, head=B, base=A, params={"no_such_param": 1})
    with pytest.raises(ValueError, match="base must be"):  # the request itself (API: 422)
        gate(env, head=B, base="../x")
    with pytest.raises(GateInputError, match="invalid parameters"):
        gate(env, head=B, base=A, params={"repeats": "many"})
    assert runner.submitted == []
    ok = gate(env, head=B, base=A, params={"repeats": 12})  # overrides reach every job
    assert ok.exit_code == EXIT_PASS
    with Session(engine) as s:
        assert {s.get(JobRow, j.job_id).params["repeats"] for j in ok.jobs} == {12}


def test_default_suites_are_those_that_run_on_the_device_and_world_size(env) -> None:
    from service.domain.gate import suites_for

    cpu1 = suites_for(GateRequest(head=B, device="cpu", world_size=1))
    assert "stability" not in cpu1 and "gdn-op" in cpu1  # stability needs two ranks
    assert "stability" in suites_for(GateRequest(head=B, device="cpu", world_size=2))


def test_an_error_at_head_only_is_a_regression_and_on_both_sides_undecidable(env) -> None:
    head_only = gate(env, head=R, base=B)
    assert head_only.exit_code == EXIT_FAIL and "errored" in head_only.reason
    both = gate(env, head=R, base=R, reuse=False)
    assert both.exit_code == EXIT_INFRA and "error on both sides" in both.reason
    assert "gatetime/sleep" in both.reason


def test_giving_up_cancels_the_jobs_the_gate_queued(env) -> None:
    engine, runner = env
    runner.run_now = False
    gate(env, head=B, base=A, run_id="g")
    head_id, base_id = runner.submitted
    with Session(engine) as s, s.begin():
        s.execute(update(JobRow).where(JobRow.id == base_id).values(status="failed", error="rank 0 died"))
    state = gate(env, head=B, base=A, run_id="g")
    assert state.exit_code == EXIT_INFRA
    assert f"cancelled the gate's pending job(s) [{head_id}]" in state.reason
    with Session(engine) as s:
        assert s.get(JobRow, head_id).status == "cancelled"


def test_a_change_not_yet_significant_is_measured_again_interleaved_and_pooled(env) -> None:
    undecided = gate(env, head=N, base=NB, max_rounds=0)
    assert undecided.exit_code == EXIT_INFRA, gate_markdown(undecided)
    assert undecided.undecided == ["gatetime/sleep"] and "could not decide" in undecided.reason
    decided = gate(env, head=N, base=NB, max_rounds=5, confirm=False)  # the same first jobs, then rounds
    assert decided.rounds >= 1, gate_markdown(decided)
    roles = [j.role for j in decided.jobs]
    assert roles[:2] == ["head", "base"] and roles[2:4] == ["round-base", "round-head"]
    ids = [j.job_id for j in decided.jobs]
    assert ids[2] < ids[3]  # each round's base job is queued before its head job
    assert decided.exit_code == EXIT_FAIL and sleep_metric(decided).verdict == "regressed"
    m = sleep_metric(decided)
    assert m.head is not None and m.head.count == 10 * (decided.rounds + 1)  # every round pooled
    # each table says which jobs its numbers come from: the first pair as measured, then the decision
    (measured,) = decided.measured
    assert (measured.base.job_id, measured.head.job_id) == (ids[1], ids[0]) and not measured.pooled
    first = next(mm for c in measured.cases for mm in c.metrics if mm.metric == "sleep_ms")
    assert first.verdict == "inconclusive" and first.head.count == 10
    md = gate_markdown(decided)
    assert f"job [#{ids[0]}](/jobs/{ids[0]}) (head" in md
    heads = [j.job_id for j in decided.jobs if j.role in ("head", "round-head")]
    assert "decided over pooled jobs " + ", ".join(f"[#{j}](/jobs/{j})" for j in heads) in md
    (finding,) = decided.to_dict()["findings"]
    assert finding["change"] == "regression" and finding["head_jobs"] == heads


def test_a_gate_whose_only_change_is_an_improvement_passes_and_names_it(env) -> None:
    state = gate(env, head=F, base=B)
    assert state.exit_code == EXIT_PASS and state.verdict == "pass", gate_markdown(state)
    m = sleep_metric(state)
    assert m.verdict == "improved" and 0.65 < m.ratio < 0.75
    assert "improved: gatetime/sleep sleep_ms -" in state.reason and "CI [0.6" in state.reason
    (finding,) = state.to_dict()["findings"]
    assert (finding["change"], finding["verdict"]) == ("improvement", "improved")
    assert finding["metric"] == "sleep_ms"
    md = gate_markdown(state)
    assert "### Improvements" in md and "### Regressions" not in md


def test_a_time_no_round_could_make_significant_is_not_measured_again(env) -> None:
    """Two values per job and side, one round allowed: even pooled, 4 against 4 values cannot give
    p < ALPHA, so the gate runs no round and says it could not decide."""
    state = gate(env, head=N, base=NB, max_rounds=1, confirm=False, params={"repeats": 2})
    assert sleep_metric(state).verdict == "inconclusive", gate_markdown(state)
    assert state.rounds == 0 and [j.role for j in state.jobs] == ["head", "base"]
    assert state.exit_code == EXIT_INFRA and state.undecided == ["gatetime/sleep"]



def test_a_confirmation_verdict_confirms_clears_or_leaves_undecided() -> None:
    """Every verdict a confirmation pair can give a regressed time metric: only evidence decides."""
    expected = {
        "regressed": "confirmed", "failed": "confirmed", "worsened": "confirmed",
        "unchanged": "cleared", "improved": "cleared",
        # beyond the minimum effect, not significant: neither confirmed nor cleared
        "inconclusive": "undecided",
        # the pair judged nothing: not judged, not measured (on one side or both), not comparable
        "changed": "undecided", "removed": "undecided", "added": "undecided", "errored": "undecided",
        "skipped": "undecided", "incomparable": "undecided",
    }
    assert set(expected) == set(VERDICTS)  # a new verdict needs a decision here
    assert {v: confirmation_outcome(v) for v in VERDICTS} == expected
    with pytest.raises(ValueError, match="re-run verdict 'slower' is not a verdict"):
        confirmation_outcome("slower")


def test_a_confirmation_pair_that_stays_inconclusive_is_exit_2_never_a_pass(env) -> None:
    """A regression whose confirmation pair is beyond the minimum effect but not significant, with
    no round allowed: undecided, exit 2 naming the case (before, it was `changed` and passed)."""
    state = gate(env, head=U, base=UB, confirm=True, max_rounds=0)
    (conf,) = state.confirmations
    assert conf.first_reason.startswith("median +3"), gate_markdown(state)  # the quiet first pair regressed
    assert conf.rerun_verdict == "inconclusive" and conf.outcome == "undecided" and not conf.confirmed
    assert state.exit_code == EXIT_INFRA and state.verdict == "error", gate_markdown(state)
    assert state.undecided == ["gatetime/sleep"] and state.rounds == 0
    assert "neither confirmed nor cleared in gatetime/sleep" in state.reason
    m = sleep_metric(state)
    assert m.verdict == "inconclusive"
    assert m.reason.startswith("neither confirmed nor cleared: first run median +3")
    assert [j.role for j in state.jobs] == ["head", "base", "confirm-base", "confirm"]
    assert "undecided (neither confirmed nor cleared)" in gate_markdown(state)
    assert state.to_dict()["confirmations"][0]["outcome"] == "undecided"


def test_an_inconclusive_confirmation_pair_gets_rounds_of_its_own(env) -> None:
    """The same pair with rounds allowed: re-measured as a base job then a head job per round,
    pooled with the pair (never with the first run), until the regression is confirmed."""
    state = gate(env, head=U, base=UB, confirm=True, max_rounds=5)
    assert state.exit_code == EXIT_FAIL and state.verdict == "fail", gate_markdown(state)
    (conf,) = state.confirmations
    assert conf.confirmed and conf.outcome == "confirmed" and state.rounds >= 1
    assert f"the pair pooled with {state.rounds} round(s)" in conf.rerun_reason
    roles = [j.role for j in state.jobs]
    assert roles == ["head", "base"] + ["confirm-base", "confirm"] * (state.rounds + 1)
    ids = [j.job_id for j in state.jobs]
    assert all(ids[i] < ids[i + 1] for i in range(2, len(ids) - 1, 2))  # base job queued first
    m = sleep_metric(state)
    assert m.verdict == "regressed" and m.head is not None and m.head.count == 10  # the first pair's


def test_a_stored_confirmation_shows_whether_it_counted() -> None:
    """The gate page's counted column: by the stored outcome, or (a row stored before outcomes)
    by `confirmed`."""
    from service.presentation.gate_report import counted_word

    undecided = {"outcome": "undecided", "confirmed": False}
    assert counted_word(undecided) == "undecided (neither confirmed nor cleared)"
    assert counted_word({"outcome": "cleared", "confirmed": False}) == "no (not reproduced)"
    assert counted_word({"confirmed": True}) == "yes (confirmed)"
    assert counted_word({"confirmed": False}) == "no (not reproduced)"
