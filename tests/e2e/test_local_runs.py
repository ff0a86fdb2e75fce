"""Local work kept and compared with no server, as a kernel engineer does it: `gdnval run gdn-op
--preset quick` twice (each run kept as a job of the results store GDNVAL_DB_URL names, which
`gdnval db upgrade` then finds at the current schema), then `gdnval compare` of the two prints
the compare page's verdict and table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.slow  # two gdn-op quick runs, each a rank process


def test_two_runs_kept_and_compared_without_a_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli import main
    from service.persistence.db import head_revision

    store = tmp_path / "runs.db"
    monkeypatch.setenv("GDNVAL_DB_URL", f"sqlite:///{store}")
    jobs = []
    for _ in range(2):
        ran = CliRunner().invoke(main, ["run", "gdn-op", "--preset", "quick"], catch_exceptions=False)
        assert ran.exit_code == 0, ran.output
        found = re.search(rf"stored as job (\d+) in sqlite:///{re.escape(str(store))}", ran.output)
        assert found, ran.output
        jobs.append(found[1])
    assert jobs == ["1", "2"]
    upgraded = CliRunner().invoke(main, ["db", "upgrade"])
    assert upgraded.output.strip() == f"sqlite:///{store}: {head_revision()} -> {head_revision()}"

    compared = CliRunner().invoke(main, ["compare", *jobs], catch_exceptions=False)
    assert compared.exit_code == 0, compared.output
    lines = compared.output.splitlines()
    assert lines[0] == "base job #1: gdn-op quick · installed · cpu × 1"
    assert lines[2] == "PASS: no regression" and lines[3].startswith("cases: ")
    assert "T65_stateful_hqk1_hv2_b1_eager" in compared.output and lines[-1] == "exit 0"
