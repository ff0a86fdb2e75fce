"""One exit-code table for every command: README's table is `service.domain.exit_codes`, and the
commands that give a verdict exit by it, through the CLI against a real server (SQLite, the real
local executor for gdn-op, the steerable fake for the rest)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator

import pytest

from service.domain import exit_codes
from tests.support.api_support import FAKE, Server, make_server
from tests.support.cli import gdnval
from tests.support.paths import ROOT

WRONG = "tests.support.refusing_backend:scaled_output"


def readme_table() -> dict[int, str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    return {int(m[1]): m[2] for m in re.finditer(r"^\| (\d) \| (.+?) \|$", section, re.M)}


def test_the_readme_table_is_the_one_in_the_code() -> None:
    table = readme_table()
    assert set(table) == set(exit_codes.MEANING) == {0, 1, 2, 3}
    for code, meaning in exit_codes.MEANING.items():
        assert table[code].startswith(meaning + ":"), (code, table[code])


def test_a_job_verdict_maps_to_one_code() -> None:
    f = exit_codes.for_job
    assert f({"status": "succeeded", "verdict": "passed"}) == 0
    assert f({"status": "succeeded", "verdict": "failed"}) == 1
    assert f({"status": "succeeded", "verdict": "errored", "case_counts": {"error": 1}}) == 1
    assert f({"status": "succeeded", "verdict": "errored", "case_counts": {"not_run": 2}}) == 2
    assert f({"status": "failed", "verdict": "errored"}) == 2
    assert f({"status": "cancelled", "verdict": None}) == 2
    assert f({"status": "running", "verdict": None}) == 3
    job = {"status": "succeeded", "verdict": "passed"}
    bad = {"status": "succeeded", "verdict": "failed"}
    assert exit_codes.for_campaign({"verdict": None, "jobs": [{"job": job}]}) == 3
    assert exit_codes.for_campaign({"verdict": "failed", "jobs": [{"job": job}, {"job": bad}]}) == 1
    broken = {"status": "failed", "verdict": "errored"}
    assert exit_codes.for_campaign({"verdict": "errored", "jobs": [{"job": job}, {"job": broken}]}) == 2
    assert exit_codes.for_campaign({"verdict": "passed", "jobs": [{"job": job}]}) == 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = make_server(tmp_path_factory.mktemp("exit-codes"), GDNVAL_DEVICE_LIMITS='{"cpu": 2}')
    srv.start()
    yield srv
    srv.stop()


def submit(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return gdnval("submit", *args, env={**server.env, "GDNVAL_SERVER": server.base}, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_submit_wait_exits_by_the_verdict(server: Server) -> None:
    ok = submit(server, FAKE, "--param", "cases=2", "--wait", "--timeout", "120")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verdict passed (2 passed); exit 0" in ok.stdout
    # a backend whose output is x 1.1: the job runs to its end, its cases fail
    wrong = submit(server, "gdn-op", "--param", f'backends=["eager","{WRONG}"]', "--param",
                   'timed_backends=["eager"]', "--wait", "--timeout", "500")
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert "verdict failed (2 failed, 2 passed); exit 1" in wrong.stdout, wrong.stdout
    broken = submit(server, FAKE, "--param", "fail=true", "--wait", "--timeout", "120")
    assert broken.returncode == 2, broken.stdout
    assert "job failed: rank 0: asked to fail; exit 2" in broken.stdout, broken.stdout
    slow = submit(server, FAKE, "--preset", "slow", "--wait", "--timeout", "0.5")
    assert slow.returncode == 3 and "gave up after 0.5 s" in slow.stderr, slow.stdout + slow.stderr
    listed = gdnval("jobs", "--suite", FAKE, "--json", env={**server.env, "GDNVAL_SERVER": server.base})
    queued = json.loads(listed.stdout)["items"]
    assert queued  # the jobs are there whatever the exit code said
