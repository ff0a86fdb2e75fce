"""The report's backends table on jobs stored through the store: one row per (backend,
distribution, version, commit) with the jobs that ran it, a built-in backend at each job's own
commit (whatever commit its ranks' record names), and a line where a job's ranks disagree on a
backend's version."""

from __future__ import annotations

import re
from pathlib import Path

from tests.service.presentation.suite_sections.test_network_model import (
    LAYER,
    SEPARATED,
    layer_cases,
    network_cases,
)
from tests.support.stored_report import document, report

A, B, HEAD = "a" * 40, "b" * 40, "f" * 40  # two jobs' commits, and another checkout's HEAD
FLA = {"backend": "fla", "distribution": "flash-linear-attention", "version": "0.3.0", "commit": "e" * 40}


def rows(section: str) -> list[str]:
    return re.findall(r"\| (\w+) \| ([\w.-]+) \| ([\w.+-]+) \| `?([\w–]+)`? \| ([#\d, ]+) \|", section)


def test_each_job_s_backends_at_its_own_commit(tmp_path: Path) -> None:
    at_head = [{"backend": "triton", "distribution": "gdnval", "version": "0.1.0", "commit": HEAD}]
    docs = [
        document("network", 2, A, network_cases(4, SEPARATED[4]), backends=[*at_head, FLA]),
        document("network", 2, B, network_cases(8, SEPARATED[8]), backends=[*at_head, FLA]),
        document("cp-layer", 2, B, layer_cases(LAYER), backends=at_head),
    ]
    got = report(tmp_path, docs)["Environment and backends"]
    assert rows(got) == [
        ("triton", "gdnval", "0.1.0", A[:12], "#1"),
        ("fla", "flash-linear-attention", "0.3.0", "e" * 12, "#1, #2"),  # another distribution's own commit
        ("triton", "gdnval", "0.1.0", B[:12], "#2, #3"),
    ]
    assert HEAD[:12] not in got and "disagree" not in got


def test_ranks_that_disagree_on_a_backend_version_get_a_line(tmp_path: Path) -> None:
    versions = [{"triton": "0.1.0", "fla": "0.3.0"}, {"triton": "0.1.0", "fla": "0.2.9"}]
    doc = document("network", 2, A, network_cases(4, SEPARATED[4]), backends=[FLA], rank_versions=versions)
    got = report(tmp_path, [doc])["Environment and backends"]
    assert "Job #1: its ranks disagree on fla's version: 0.3.0 on rank 0; 0.2.9 on rank 1." in got
    assert "triton's version" not in got
