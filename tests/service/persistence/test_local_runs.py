"""Runs outside the service kept as jobs: a `gdnval-run/1` document stored in the service's
shape (`service.persistence.runs`), compared without a server (`gdnval compare` of stored jobs
and of `--json` files), exported and pushed to a real server (`gdnval push`) once. The
documents are the `gatetime` suite's with known timings; `gdnval run` itself is the e2e test's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.cli import main
from service.persistence.models import ReducedCaseRow, SummaryRow
from service.persistence.runs import RunDocument, export_run, store_run
from service.settings import Settings
from tests.support.cli import gdnval_here
from tests.support.gate_runners import gatetime_store
from tests.support.gate_suite import SUITE, serve_in_thread


def run_doc(factor: float = 1.0, seed: int = 0, status: str = "passed") -> dict[str, Any]:
    """What `gdnval run gatetime --preset gate --json` writes, with sleeps `factor` times 80 ms."""
    params = SUITE.resolve_params("gate", {})
    (case,) = SUITE.cases(params)
    rng = np.random.default_rng(seed)
    samples = [{"case": case.name, "metric": "sleep_ms", "rank": 0, "idx": i,
                "value": 80.0 * factor * (1 + 0.01 * rng.standard_normal())} for i in range(params.repeats)]
    samples.append({"case": case.name, "metric": "err", "rank": 0, "idx": 0, "value": 1e-4})
    return {
        "format": "gdnval-run/1", "run_id": uuid.uuid4().hex, "suite": "gatetime", "preset": "gate",
        "overrides": {}, "params": params.model_dump(mode="json"), "device": "cpu", "world_size": 1,
        "commit": "a" * 40, "snapshot": False, "backend_source": None, "status": "succeeded",
        "verdict": "passed", "error": None, "started_at": "2026-01-02T03:04:05+00:00",
        "finished_at": "2026-01-02T03:04:09+00:00",
        "info": {"commit": "a" * 40, "metrics": [m.to_dict() for m in SUITE.metrics]},
        "cases": [{"name": case.name, "status": status, "error": None, "expected_error": None,
                   "params": dict(case.params), "fingerprint": case.fingerprint("cpu", 1)}],
        "samples": samples, "logs": ["a log line"], "nonfinite": [],
    }


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SimpleNamespace]:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with pytest.MonkeyPatch.context() as mp, gatetime_store(url, mp) as engine:
        mp.setenv("GDNVAL_DB_URL", url)
        yield SimpleNamespace(engine=engine, url=url, tmp=tmp_path)


def test_a_run_is_stored_like_a_service_job_once_per_run_id(store) -> None:
    doc = RunDocument.model_validate(run_doc())
    job, created = store_run(store.engine, doc)
    assert created and (job.status, job.verdict, job.case_counts["passed"]) == ("succeeded", "passed", 1)
    assert job.commit_sha is None and job.info["commit"] == "a" * 40
    assert job.labels == {"origin": "gdnval run"}
    with Session(store.engine) as s:  # summaries and reduced samples, as the dispatcher stores them
        assert s.scalar(select(func.count()).where(SummaryRow.job_id == job.id)) == 2
        assert s.scalar(select(func.count()).where(ReducedCaseRow.job_id == job.id)) == 1
        exported = export_run(s, job.id)
    again, created = store_run(store.engine, doc)
    assert not created and again.id == job.id
    back = RunDocument.model_validate(exported)
    assert back.run_id == doc.run_id and back.samples == doc.samples and back.cases == doc.cases
    assert back.logs == ["a log line"] and {m.name for m in back.definitions()} == {"sleep_ms", "err"}


def test_documents_that_do_not_hold_together_are_refused(store) -> None:
    cases = [
        ({"suite": "nosuch"}, "nosuch"),
        ({"cases": [{**run_doc()["cases"][0], "params": {"repeats": 3}}]}, "fingerprint"),
        ({"samples": [{"case": "other", "metric": "x", "rank": 0, "idx": 0, "value": 1.0}]}, "other"),
        ({"info": {"metrics": [{"name": "t", "kind": "speed"}]}}, "kind"),
        ({"status": "running"}, "status"),
    ]
    for change, named in cases:
        with pytest.raises(ValidationError, match=named):
            RunDocument.model_validate({**run_doc(), **change})


def test_compare_two_stored_runs_and_two_json_files_without_a_server(store) -> None:
    base, _ = store_run(store.engine, RunDocument.model_validate(run_doc(seed=1)))
    same, _ = store_run(store.engine, RunDocument.model_validate(run_doc(seed=2)))
    slow, _ = store_run(store.engine, RunDocument.model_validate(run_doc(1.3, seed=3)))
    unchanged = gdnval_here("compare", str(base.id), str(same.id))
    assert unchanged.exit_code == 0, unchanged.output
    assert f"base job #{base.id}: gatetime gate" in unchanged.output
    assert "PASS: no regression" in unchanged.output
    regressed = gdnval_here("compare", str(base.id), str(slow.id), "--show", "all")
    assert regressed.exit_code == 1, regressed.output
    assert "FAIL: 1 case(s) regressed or failed" in regressed.output
    assert "sleep_ms" in regressed.output and "regressed" in regressed.output and "err" in regressed.output

    a, b = store.tmp / "a.json", store.tmp / "b.json"
    a.write_text(json.dumps(run_doc(seed=4)))
    b.write_text(json.dumps(run_doc(1.3, seed=5)))
    files = gdnval_here("compare", str(a), str(b), "--db", str(store.tmp / "absent.db"))  # no store needed
    assert files.exit_code == 1 and "base " + str(a) in files.output and "regressed" in files.output
    assert not (store.tmp / "absent.db").exists()
    mixed = gdnval_here("compare", str(base.id), str(b))
    assert mixed.exit_code == 1, mixed.output
    (store.tmp / "notes.txt").write_text("not a run")
    for args, why in ((("999", str(base.id)), "no job 999"), ((str(store.tmp / "x.json"), "1"), "x.json"),
                      ((str(base.id), str(store.tmp / "notes.txt")), "not a `gdnval run --json` document")):
        refused = CliRunner().invoke(main, ["compare", *args])
        assert refused.exit_code == 2 and why in refused.output, refused.output


def test_push_stores_a_local_run_on_the_service_once(store) -> None:
    job, _ = store_run(store.engine, RunDocument.model_validate(run_doc(1.3)))
    server_url = f"sqlite:///{store.tmp / 'server.db'}"
    settings = Settings(db_url=server_url, dispatch=False, executor="local", artifacts_dir=store.tmp / "art")
    with serve_in_thread(settings) as url:
        first = gdnval_here("push", str(job.id), "--server", url)
        assert first.exit_code == 0 and "(stored)" in first.output, first.output
        pushed = int(first.output.split("/jobs/")[1].split()[0])
        again = gdnval_here("push", str(job.id), "--server", url)
        assert again.exit_code == 0 and f"/jobs/{pushed} (already there)" in again.output
        import httpx

        there = httpx.get(f"{url}/api/v1/jobs/{pushed}").json()
        assert (there["status"], there["verdict"]) == ("succeeded", "passed")
        assert there["case_counts"]["passed"] == 1
        with Session(store.engine) as s:
            local = export_run(s, job.id)
        assert httpx.get(f"{url}/api/v1/jobs/{pushed}/samples", params={"limit": 100}).json()["items"][0][
            "value"] == local["samples"][0]["value"]
        missing = CliRunner().invoke(main, ["push", "999", "--server", url])
        assert missing.exit_code == 2 and "no job 999" in missing.output
