"""`gdnval run` end to end on a 2-rank gloo job: table, JSON document and exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from service.cli import main
from tests.support.paths import ROOT
from tests.support.suites import probe_registered

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def probe_suite():
    with probe_registered():
        yield


def test_run_reports_failed_and_errored_cases_with_exit_1_and_writes_every_sample(tmp_path: Path) -> None:
    """A bound violation fails its case; a case that raises on every rank is an error and the job
    goes on to the next case."""
    report = tmp_path / "probe.json"
    args = ["run", "probe", "--world-size", "2", "--param", "bound_violation=true", "--param", "repeats=2",
            "--param", "fault=case_error", "--json", str(report)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "bounded" in result.output
    assert "verdict errored (1 error, 1 failed, 1 expected_error, 2 passed)" in result.output
    assert "RuntimeError: probe fault on rank" in result.output
    doc = json.loads(report.read_text())
    assert doc["status"] == "succeeded" and doc["exit_code"] == 1 and doc["world_size"] == 2
    assert doc["overrides"] == {"bound_violation": True, "repeats": 2, "fault": "case_error"}
    cases = {c["name"]: c for c in doc["cases"]}
    assert cases["bounded"]["status"] == "failed"
    assert "value worst 2 breaks bound <= 1" in cases["bounded"]["error"]  # over both ranks
    assert doc["verdict"] == "errored" and doc["case_counts"]["error"] == 1
    assert cases["collective"]["status"] == "passed" and len(cases["collective"]["fingerprint"]) == 20
    assert cases["fault"]["status"] == "error"
    assert "RuntimeError: probe fault on rank" in cases["fault"]["error"]
    assert cases["after_fault"]["status"] == "passed"
    def reduced(case: str) -> list[tuple[int, int, float]]:
        return sorted((s["rank"], s["idx"], s["value"]) for s in doc["samples"]
                      if s["metric"] == "allreduce_sum" and s["case"] == case)

    assert reduced("collective") == [(0, 0, 3.0), (0, 1, 3.0), (1, 0, 3.0), (1, 1, 3.0)]
    assert reduced("after_fault") == [(0, 0, 3.0), (1, 0, 3.0)]  # both ranks in step after the fault
    summary = {(r["case"], r["metric"]): r for r in doc["summary"]}
    assert summary[("bounded", "value")]["passed"] is False and summary[("bounded", "value")]["count"] == 1
    assert summary[("collective", "allreduce_sum")]["median"] == 3.0
    assert [r["rank"] for r in doc["info"]["ranks"]] == [0, 1]


def test_dry_run_lists_the_cases_of_a_gpu_job_without_starting_ranks(tmp_path: Path) -> None:
    report = tmp_path / "never.json"
    args = ["run", "cp-layer", "--preset", "full", "--device", "cuda", "--world-size", "8",
            "--param", "seq_lens=[65536,131072]", "--json", str(report), "--dry-run"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "cp-layer --preset full --device cuda --world-size 8: 11 case(s)"
    assert "  p2p_triton_T131072_B1" in lines and "  all_gather_eager_T8192_B2_valid7777" in lines
    assert "  none_triton_T16384_B1_packed8" in lines  # the packed 16K batch, every mode
    assert not report.exists()  # nothing ran, nothing written
    bad = CliRunner().invoke(main, ["run", "cp-layer", "--param", 'candidates=["ring+eager"]', "--dry-run"])
    assert bad.exit_code == 2 and "bad candidate 'ring+eager'" in bad.output


def test_run_rejects_unknown_input_before_starting_ranks() -> None:
    result = CliRunner().invoke(main, ["run", "probe", "--preset", "nightly"])
    assert result.exit_code == 2 and "unknown preset 'nightly'" in result.output
    result = CliRunner().invoke(main, ["run", "nosuch"])
    assert result.exit_code == 2 and "unknown suite 'nosuch'" in result.output
    result = CliRunner().invoke(main, ["run", "probe", "--param", "novalue"])
    assert result.exit_code == 2 and "expected KEY=VALUE" in result.output


RUN_WITH_PROBE = """
import sys
from workers.registry import SUITE_MODULES
SUITE_MODULES["probe"] = "tests.support.suites"
from service.cli import main
main(sys.argv[1:])
"""


def test_sigterm_cancels_the_run_and_still_writes_what_finished(tmp_path: Path) -> None:
    """`timeout` stops a long device run with SIGTERM: the finished cases must reach --json."""
    import os
    import signal
    import subprocess
    import sys
    import time

    report = tmp_path / "probe.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_WITH_PROBE, "run", "probe", "--param", "fault=hang", "--param",
         "fault_rank=0", "--json", str(report)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    seen = ""
    while "probe output from rank 0" not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert "probe output from rank 0" in seen, seen  # the first case ran; the fault case will hang
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 2, seen + out
    doc = json.loads(report.read_text())
    assert doc["status"] == "cancelled"
    cases = {c["name"]: c["status"] for c in doc["cases"]}
    assert cases["collective"] == "passed" and cases["after_fault"] == "not run"
    assert sorted(s["idx"] for s in doc["samples"] if s["metric"] == "allreduce_sum") == [0, 1, 2]
