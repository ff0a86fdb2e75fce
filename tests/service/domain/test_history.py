"""Commit-ordered history over the real store and a real git repository: one point per commit
in first-parent order, pooled over that commit's jobs, each judged by the compare engine against
the commit measured before; one pair of jobs read through the compare API, the history API and
a gate says the same per metric. Also the gates list's filters and `gdnval jobs --commit` for
jobs that ran our installed code. Jobs are "run" at submission by a runner that writes the
`gatetime` suite's samples with a per-commit slow-down (the real executor path is the e2e tests')."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.app import create_app
from service.cli import main
from service.domain.gate import evaluate_gate
from service.persistence.models import JobRow
from service.settings import Settings
from tests.support.gate_runners import GATE, TimedRunner, gatetime_store
from tests.support.gate_suite import git, serve_in_thread


@pytest.fixture
def env(tmp_path: Path) -> Iterator[SimpleNamespace]:
    """c1..c5 on one first-parent line (and c1b on a side branch merged into c3); c3 and later
    30 % slower; a job at c1, c3, c4 and c5 (none at c2), two at c5."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas: dict[str, str] = {}
    for name in ("c1", "c2", "c3", "c4", "c5"):
        if name == "c3":  # a merge: its second parent's commit is not on the first-parent line
            git(repo, "checkout", "-q", "-b", "side", shas["c2"])
            (repo / "side.txt").write_text("side")
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", "side")
            shas["side"] = git(repo, "rev-parse", "HEAD")
            git(repo, "checkout", "-q", "main")
            git(repo, "merge", "-q", "--no-ff", "--no-commit", "side")
        (repo / "code.txt").write_text(name)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", name)
        shas[name] = git(repo, "rev-parse", "HEAD")
    url = f"sqlite:///{tmp_path / 'history.db'}"
    with pytest.MonkeyPatch.context() as mp, gatetime_store(url, mp) as engine:
        mp.setenv("GDNVAL_REPO", str(repo))
        runner = TimedRunner(engine, {shas[c]: 1.3 for c in ("c3", "c4", "c5", "side")})
        jobs = {c: runner.job(shas[c]) for c in ("c1", "c3", "c4", "c5", "side")}
        jobs["c5b"] = runner.job(shas["c5"])
        with TestClient(create_app(Settings(db_url=url, dispatch=False, executor="local"))) as client:
            yield SimpleNamespace(repo=repo, shas=shas, jobs=jobs, engine=engine, runner=runner, url=url,
                                  client=client, mp=mp)


def history(env: SimpleNamespace, **params: Any) -> dict[str, Any]:
    resp = env.client.get("/api/v1/history", params={"suite": "gatetime", **params})
    assert resp.status_code == 200, resp.text
    return resp.json()


def verdicts(cmp_cases: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    return {(c["fingerprint"], m["metric"]): m["verdict"] for c in cmp_cases for m in c["metrics"]}


def test_one_point_per_commit_in_first_parent_order_judged_by_compare(env) -> None:
    got = history(env)
    shas, jobs = env.shas, env.jobs
    assert [c["commit"] for c in got["commits"]] == [shas[c] for c in ("c1", "c2", "c3", "c4", "c5")]
    by = {c["commit"]: c for c in got["commits"]}
    assert by[shas["c2"]]["jobs"] == [] and by[shas["c2"]]["verdict"] is None  # listed, not measured
    assert by[shas["c3"]]["against"] == shas["c1"] and by[shas["c3"]]["verdict"] == "regressed"
    assert by[shas["c4"]]["verdict"] == "unchanged" and by[shas["c5"]]["jobs"] == [jobs["c5"], jobs["c5b"]]
    (sleep,) = [s for s in got["series"] if s["metric"] == "sleep_ms"]
    assert [p["commit"] for p in sleep["points"]] == [shas[c] for c in ("c1", "c3", "c4", "c5")]
    assert sleep["points"][0]["verdict"] is None and sleep["points"][0]["count"] == 10
    assert sleep["points"][-1]["count"] == 20  # c5's two jobs pooled
    assert 1.25 < sleep["points"][1]["median"] / sleep["points"][0]["median"] < 1.35

    # the same pair of jobs through the compare API and a gate: the same verdict per metric
    pair = {"base": jobs["c1"], "head": jobs["c3"]}
    compared = verdicts(env.client.get("/api/v1/compare", params=pair).json()["cases"])
    in_history = {(s["fingerprint"], s["metric"]): p["verdict"] for s in got["series"] for p in s["points"]
                  if p["commit"] == shas["c3"]}
    gate = evaluate_gate(env.engine, GATE.model_copy(update={"head": shas["c3"], "base": shas["c1"]}),
                         env.runner)
    assert {j.job_id for j in gate.jobs} == set(pair.values())  # the gate reused exactly those jobs
    gated = verdicts([{"fingerprint": c.fingerprint, "metrics": [{"metric": m.metric, "verdict": m.verdict}
                                                                 for m in c.metrics]}
                      for c in gate.comparisons[0].cases])
    assert compared == in_history == gated
    assert compared[next(k for k in compared if k[1] == "sleep_ms")] == "regressed"


def test_filters_settings_and_refusals(env) -> None:
    shas = env.shas
    assert {s["metric"] for s in history(env, metric="err")["series"]} == {"err"}
    assert history(env, kind="time")["commits"][2]["verdict"] == "regressed"
    assert history(env, kind="accuracy")["commits"][2]["verdict"] == "unchanged"  # only the shown series
    assert history(env, case="nomatch")["series"] == []
    fp = history(env)["series"][0]["fingerprint"]
    assert {s["fingerprint"] for s in history(env, case=fp)["series"]} == {fp}
    assert [c["commit"] for c in history(env, last=2)["commits"]] == [shas["c4"], shas["c5"]]
    assert history(env, tip=shas["c3"])["commits"][-1]["commit"] == shas["c3"]
    # another setting at c2 is listed, never pooled with the gate-preset jobs
    env.runner(suite="gatetime", preset="quick", params={}, commit=shas["c2"], device="cpu", world_size=1)
    got = history(env)
    assert [s["preset"] for s in got["settings"]] == [got["setting"]["preset"], "quick"]
    assert got["commits"][1]["jobs"] == []
    quick = history(env, setting=got["settings"][1]["key"])
    assert [bool(c["jobs"]) for c in quick["commits"]] == [False, True, False, False, False]
    for bad, why in (({"backend_repo": "/nowhere"}, "no stored job installed a backend from"),
                     ({"tip": "--upload-pack=x"}, "tip must be")):
        resp = env.client.get("/api/v1/history", params={"suite": "gatetime", **bad})
        assert resp.status_code == 422 and why in resp.json()["detail"], resp.text
    env.mp.delenv("GDNVAL_REPO")
    resp = env.client.get("/api/v1/history", params={"suite": "gatetime"})
    assert resp.status_code == 422 and "GDNVAL_REPO" in resp.json()["detail"]


def test_history_pages(env) -> None:
    shas = env.shas
    page = env.client.get("/history", params={"suite": "gatetime"}).text
    order = [page.index(f'data-commit="{shas[c]}"') for c in ("c1", "c2", "c3", "c4", "c5")]
    assert order == sorted(order) and page.count(f'<tr data-commit="{shas["c3"]}"') == 1
    assert f'<tr data-commit="{shas["c3"]}" data-verdict="regressed">' in page
    assert 'id="overview-table"' in page and "svg" in page
    fp = history(env)["series"][0]["fingerprint"]
    one = env.client.get("/history", params={"fingerprint": fp, "metric": "sleep_ms"}).text
    assert one.count('<tr data-commit="') == 4 + 5  # the series' points, then every commit
    assert 'figure class="plot" data-plot="history"' in one and "regressed" in one
    redirected = env.client.get("/history/gatetime", params={"kind": "time"})  # one series: its chart
    assert redirected.status_code == 200 and 'id="history-table"' in redirected.text
    assert "sleep_ms</span></h2>" in redirected.text
    assert env.client.get("/history", params={"fingerprint": "nope"}).status_code == 404
    env.mp.delenv("GDNVAL_REPO")
    refused = env.client.get("/history", params={"suite": "gatetime"})
    assert refused.status_code == 422 and "GDNVAL_REPO" in refused.text


def test_gates_filter_by_head_base_backend_and_verdict(env) -> None:
    shas = env.shas
    for head, base in (("c3", "c1"), ("c4", "c1"), ("c5", "c4")):
        req = GATE.model_copy(update={"head": shas[head], "base": shas[base]})
        evaluate_gate(env.engine, req, env.runner)

    def listed(**params: str) -> list[tuple[str, str, str]]:
        items = env.client.get("/api/v1/gates", params=params).json()["items"]
        assert all(g["jobs"] and {j["role"] for j in g["jobs"]} == {"head", "base"} for g in items)
        return [(g["head"], g["base"], g["verdict"]) for g in items]

    assert listed(base=shas["c1"][:8]) == [(shas["c4"], shas["c1"], "fail"), (shas["c3"], shas["c1"], "fail")]
    assert listed(head=shas["c5"], verdict="pass") == [(shas["c5"], shas["c4"], "pass")]
    assert listed(verdict="error") == [] and listed(backend="extgdn") == []
    assert env.client.get("/api/v1/gates", params={"head": "xyz!"}).status_code == 422
    page = env.client.get("/gates", params={"verdict": "pass"}).text
    assert page.count('<tr data-gate="') == 1
    assert env.client.get("/gates", params={"verdict": "maybe"}).status_code == 422

    with serve_in_thread(Settings(db_url=env.url, dispatch=False, executor="local")) as url:
        out = CliRunner().invoke(main, ["gates", "--head", "HEAD", "--repo", str(env.repo), "--server", url])
        assert out.exit_code == 0, out.output
        assert f"{url}/gates/" in out.output and "pass" in out.output and shas["c5"][:12] in out.output
        assert shas["c3"][:12] not in out.output
        bad = CliRunner().invoke(main, ["gates", "--head", "nosuchref", "--repo", str(env.repo),
                                        "--server", url])
        assert bad.exit_code == 2 and "nosuchref" in bad.output


def test_jobs_by_commit_include_jobs_of_the_installed_code_at_it(env) -> None:
    """A job submitted without a commit ran our installed code: its ranks recorded the commit
    (`info.commit`), and `gdnval jobs --commit SHA` (docs/howto-backend.md) lists it."""
    sha = env.shas["c2"]
    quick = {"suite": "gatetime", "preset": "quick", "params": {}, "commit": None, "device": "cpu",
             "world_size": 1}
    installed = env.runner(**quick)
    backend = env.runner(**quick, labels={"backend_source": "git+/elsewhere@" + "e" * 40})
    with Session(env.engine) as s, s.begin():
        for job_id in (installed, backend):
            s.get(JobRow, job_id).info = {"commit": sha, "source_modified": False}
    with serve_in_thread(Settings(db_url=env.url, dispatch=False, executor="local")) as url:
        for ref in (sha, sha[:10]):
            out = CliRunner().invoke(main, ["jobs", "--commit", ref, "--json", "--server", url])
            assert out.exit_code == 0, out.output
            assert {j["id"] for j in json.loads(out.output)["items"]} == {installed, backend}
    by_backend = env.client.get("/api/v1/jobs", params={"commit": "e" * 40}).json()["items"]
    assert [j["id"] for j in by_backend] == [backend]
