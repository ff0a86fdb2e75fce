"""The CLI fails in one line: a service that is down, a store that is not there, a parameter
value no rank could run are each one line on stderr (no traceback) and a non-zero exit; tables
keep every character when piped; JSON output is strict."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import httpx
import pytest

from service.cli.output import dumps, strict_json
from tests.support.api_support import FAKE, TOKEN, make_server
from tests.support.cli import gdnval, one_line_error
from tests.support.ports import free_port


def test_commands_against_a_service_that_is_down() -> None:
    down = f"http://127.0.0.1:{free_port()}"
    one_line_error(no_store("jobs", "--server", down), f"cannot reach the service at {down}")
    one_line_error(no_store("submit", "capability", "--server", down), f"cannot reach the service at {down}")
    one_line_error(no_store("report", "1", "--server", down), f"cannot reach the service at {down}")


def test_report_on_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    one_line_error(no_store("report", "1", "--db", str(missing)), f"no results store at {missing}")
    one_line_error(no_store("report", "1", "--db", f"sqlite:///{missing}"), f"no results store at {missing}")
    assert not missing.exists() and list(tmp_path.iterdir()) == []


def test_dry_run_validates_parameter_values() -> None:
    for param, shown in (("dtype=float7", "float7"), ("seq_lens=[-5]", "-5")):
        r = no_store("run", "gdn-op", "--dry-run", "--param", param)
        assert r.returncode != 0 and shown in r.stdout + r.stderr and "Traceback" not in r.stderr, r
    ok = no_store("run", "gdn-op", "--dry-run", "--param", "dtype=float32", "--param", "seq_lens=[65]")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.slow  # a real server process
def test_piped_job_table_keeps_whole_values_and_json_is_strict(tmp_path: Path) -> None:
    fake = "tests.support.api_support:make_fake_executor"
    server = make_server(tmp_path, executor=fake, GDNVAL_DISPATCH="false")
    server.start()
    try:
        ref = "release/2026.12-with-a-rather-long-branch-name"
        body = {"suite": FAKE, "preset": "slow", "commit": ref, "labels": {"who": "cli-test"}}
        auth = {"Authorization": f"Bearer {TOKEN}"}
        job = httpx.post(f"{server.base}/api/v1/jobs", json=body, headers=auth).json()
        r = no_store("jobs", "--server", server.base)
        assert r.returncode == 0, r.stderr
        row = next(line for line in r.stdout.splitlines() if f" {job['id']} " in line)
        for whole in (FAKE, "slow", "queued", ref, job["created_at"][:19].replace("T", " ")):
            assert whole in row, (whole, row)
        assert "…" not in r.stdout
        page = json.loads(no_store("jobs", "--server", server.base, "--json").stdout)
        assert page["items"][0]["id"] == job["id"]
    finally:
        server.stop()


def test_strict_json_replaces_non_finite_numbers_and_says_where() -> None:
    value = {"a": [1.0, math.nan, {"b/c": math.inf}], "d": -math.inf, "e": "NaN", "f": 2}
    clean, where = strict_json(value)
    assert clean == {"a": [1.0, None, {"b/c": None}], "d": None, "e": "NaN", "f": 2}
    assert where == ["/a/1", "/a/2/b~1c", "/d"]
    text = dumps(value)
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text
    assert json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))) == clean


def no_store(*args: str) -> subprocess.CompletedProcess[str]:
    """`gdnval ARGS` in a process of its own, with no results store named (the default's)."""
    return gdnval(*args, unset=("GDNVAL_DB_URL",))

