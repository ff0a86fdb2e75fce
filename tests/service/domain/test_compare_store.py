"""The compare engine over the real store: loading jobs, commits, baselines and parent commits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.orm import Session

from service.domain.baselines import (
    NotFound,
    compare_commits,
    compare_jobs,
    load_side,
    parse_job_ref,
    resolve_base,
)
from service.persistence import baselines as baseline_store
from service.persistence import cases as case_store
from service.persistence import commits as commit_store
from service.persistence import samples as sample_store
from service.persistence.jobs import find_commit_job
from service.persistence.models import JobRow
from workers.suite import Case, Metric

SUITE = "cmpstore"
METRICS = (
    Metric("fwd_ms", "ms", "time"),
    Metric("peak", "bytes", "memory"),
    Metric("o_rel_l2", "", "accuracy", bound=1e-2),
    Metric("loss_err", "", "trajectory", bound=1e-3),
)
CASES = [Case(SUITE, "small", {"T": 1}), Case(SUITE, "big", {"T": 2}), Case(SUITE, "crash", {"T": 3})]


def add_job(engine, sha: str, *, slow: float = 1.0, nan_step: int | None = None, crash: bool = False,
            status: str = "succeeded", preset: str = "gate", ranks: int = 2) -> int:
    rng = np.random.default_rng(len(sha) + int(slow * 100))
    with Session(engine) as s, s.begin():
        commit = commit_store.ensure_commit(s, sha)
        # cuda: 1 % noise is a quiet device's (on cpu an undeclared time counts from 2x only)
        job = JobRow(suite=SUITE, preset=preset, params={}, commit_id=commit.id, device="cuda",
                     world_size=ranks, status=status)
        s.add(job)
        s.flush()
        mids = sample_store.ensure_metrics(s, SUITE, METRICS)
        cids = case_store.ensure_cases(s, CASES, "cuda", ranks)
        job_id = job.id
        for c in CASES:
            if c.name == "crash" and crash:
                case_store.set_case_result(s, job_id, cids[c.name], "error", "Traceback\nRuntimeError: boom")
            else:
                case_store.set_case_result(s, job_id, cids[c.name], "passed", None)
    rows = []
    for c in CASES:
        if c.name == "crash" and crash:
            continue
        cid = cids[c.name]
        for r in range(ranks):
            for i in range(20):
                rows.append((cid, mids["fwd_ms"], r, i, 10.0 * slow * (1 + 0.01 * rng.standard_normal())))
            rows.append((cid, mids["peak"], r, 0, 100e6 + r))
            rows.append((cid, mids["o_rel_l2"], r, 0, 1e-3))
            for step in range(5):
                v = float("nan") if nan_step == step and r == 1 else 1e-4
                rows.append((cid, mids["loss_err"], r, step, v))
    sample_store.insert_samples(engine, job_id, rows)
    return job_id


def test_load_side_reads_rank_reduced_samples_cases_and_metrics(engine) -> None:
    job = add_job(engine, "a" * 40, crash=True)
    with Session(engine) as s:
        side = load_side(s, job)
    assert side.ref.job_id == job and side.ref.commit == "a" * 40 and side.ref.world_size == 2
    # one row per (case, metric, idx), reduced over the job's 2 ranks in SQL, each saying so
    assert len(side.samples) == 2 * (20 + 1 + 1 + 5)
    assert side.samples.ranks is not None and set(side.samples.ranks.tolist()) == {2}
    statuses = {c.name: c.status for c in side.cases.values()}
    assert statuses == {"small": "passed", "big": "passed", "crash": "error"}
    assert side.metrics["o_rel_l2"].bound == 1e-2 and side.metrics["fwd_ms"].kind == "time"
    fp = CASES[0].fingerprint("cuda", 2)
    assert fp in side.cases and side.cases[fp].params == {"T": 1}


def test_compare_jobs_from_the_store(engine) -> None:
    base = add_job(engine, "b" * 40)
    head = add_job(engine, "c" * 40, slow=1.2, nan_step=3, crash=True)
    with Session(engine) as s:
        cmp = compare_jobs(s, base, head)
    by = {c.name: c for c in cmp.cases}
    small = {m.metric: m for m in by["small"].metrics}
    assert small["fwd_ms"].verdict == "regressed"
    assert small["loss_err"].verdict == "failed" and "idx 3" in small["loss_err"].reason  # stored NaN = NULL
    assert small["peak"].verdict == "unchanged" and small["peak"].head.ranks == 2
    assert by["crash"].verdict == "errored"
    assert not cmp.passed


def test_commits_baselines_and_parents(engine, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    shas = []
    for i in range(2):
        (repo / "f.txt").write_text(str(i))
        subprocess.run([*git, "add", "f.txt"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"c{i}"], check=True)
        out = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        shas.append(out.stdout.strip())
    base_job = add_job(engine, shas[0])
    add_job(engine, shas[0], status="failed")
    add_job(engine, shas[0], preset="quick")
    head_job = add_job(engine, shas[1], slow=0.8)
    with Session(engine) as s, s.begin():
        assert find_commit_job(s, shas[0][:10], SUITE, preset="gate").id == base_job
        assert find_commit_job(s, shas[0], SUITE, preset="gate", world_size=4) is None
        cmp = compare_commits(s, shas[0], shas[1], SUITE, preset="gate")
        assert (cmp.base.job_id, cmp.head.job_id) == (base_job, head_job)
        assert {c.verdict for c in cmp.cases} >= {"improved"}
        with pytest.raises(NotFound, match="at commit 'deadbeef'"):
            compare_commits(s, "deadbeef", shas[1], SUITE)

        parent = resolve_base(s, shas[1], repo=repo)
        assert (parent.kind, parent.value) == ("commit", shas[0])
        assert resolve_base(s, "HEAD", base="HEAD~1", repo=repo).value == shas[0]
        assert resolve_base(s, shas[1], base=f"job:{base_job}").job_id == base_job
        baseline_store.set_baseline(s, "main", commit=shas[0])
        baseline_store.set_baseline(s, "golden", job_id=base_job)
        s.flush()
        assert resolve_base(s, shas[1], baseline="main").value == shas[0]
        assert resolve_base(s, shas[1], baseline="golden").job_id == base_job
        with pytest.raises(NotFound, match=r"no baseline named 'nope'; expected one of \['golden', 'main'\]"):
            resolve_base(s, shas[1], baseline="nope")
        with pytest.raises(NotFound, match="give --base or --baseline"):
            resolve_base(s, shas[0], repo=repo)  # the root commit has no parent
        with pytest.raises(ValueError, match="not both"):
            resolve_base(s, shas[1], base="x", baseline="main")
    assert parse_job_ref("#12") == 12 and parse_job_ref("job:7") == 7 and parse_job_ref("abc1234") is None


def test_load_side_of_a_missing_job_names_it(engine) -> None:
    with Session(engine) as s, pytest.raises(NotFound, match="no job 999"):
        load_side(s, 999)
