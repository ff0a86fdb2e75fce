"""The job page on a large job (in-process app, SQLite file): what it draws stays bounded, the
subsample is taken in SQL with its counts printed, and step bins keep the worst value (a spike)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.app import create_app
from service.persistence import cases as case_store
from service.persistence import db, summaries
from service.persistence import samples as sample_store
from service.persistence.models import JobRow
from service.settings import Settings
from service.web import charts
from workers.suite import Case, Metric

SUITE = "web-data"
REPS, RANKS, STEPS = 3000, 2, 2000
METRICS = (Metric("fwd_ms", "ms", "time"), Metric("loss_max_rel", "", "trajectory", bound=1e-3))


@pytest.fixture(scope="module")
def page_html(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    tmp = tmp_path_factory.mktemp("webdata")
    url = f"sqlite:///{tmp / 'big.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    rng = np.random.default_rng(0)
    cases = [Case(SUITE, "big", {"seq_len": 8192})]
    with Session(engine) as s, s.begin():
        job = JobRow(suite=SUITE, preset="full", params={}, device="cuda", world_size=RANKS,
                     status="succeeded", attempts=1, info={})
        s.add(job)
        s.flush()
        mids = sample_store.ensure_metrics(s, SUITE, METRICS)
        cid = case_store.ensure_cases(s, cases, "cuda", RANKS)["big"]
        case_store.set_case_result(s, job.id, cid, "passed", None)
        job_id = job.id
    times = rng.normal(10.0, 0.2, (RANKS, REPS))
    loss = np.full((RANKS, STEPS), 1e-5)
    loss[1, 1234] = 7e-4  # one spike on one rank at one step
    rows = [(cid, mids["fwd_ms"], r, i, float(times[r, i])) for r in range(RANKS) for i in range(REPS)]
    rows += [(cid, mids["loss_max_rel"], r, i, float(loss[r, i])) for r in range(RANKS) for i in range(STEPS)]
    sample_store.insert_samples(engine, job_id, rows)
    with Session(engine) as s, s.begin():
        summaries.store_summary(s, job_id)
    engine.dispose()
    settings = Settings(db_url=url, dispatch=False, executor="local")
    with TestClient(create_app(settings)) as client:
        r = client.get(f"/jobs/{job_id}")
        assert r.status_code == 200
        # the case's plots are a fragment the page loads as the case comes into view
        plots = client.get(f"/jobs/{job_id}/plots", params={"case": cases[0].fingerprint("cuda", RANKS)})
        assert plots.status_code == 200 and 'class="rep"' not in r.text
        return r.text + plots.text, job_id


def test_long_lanes_are_subsampled_in_sql_with_the_counts_shown(page_html: tuple[str, int]) -> None:
    html, _ = page_html
    dots = html.count('class="rep"')
    k = -(-REPS // charts.MAX_POINTS)  # ceil: every k-th repetition keeps <= MAX_POINTS per lane
    assert dots == RANKS * len(range(0, REPS, k))
    assert f"every {k}th repetition of every rank ({dots} of {REPS * RANKS} samples, {RANKS} rank(s))" in html
    # the table keeps the exact statistics of all repetitions
    assert re.search(rf'data-metric="fwd_ms">.*?>{REPS} × {RANKS} ranks</td>', html, re.S)


def test_long_trajectories_keep_the_worst_step_of_each_bin(page_html: tuple[str, int]) -> None:
    html, _ = page_html
    k = -(-STEPS // charts.MAX_STEPS)
    pts = re.search(r'class="traj" stroke="[^"]+" style="[^"]+" points="([^"]+)"', html).group(1).split()
    assert len(pts) == -(-STEPS // k)
    assert f"max per {k} steps" in html
    assert "worst 7.000e-04" in html  # the one-rank, one-step spike survives rank reduction and binning
