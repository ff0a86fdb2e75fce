"""A kernel's own repository gated on that kernel, exactly as docs/howto-backend.md says: a
pure-torch backend package (entry point `extgdn`: the eager chunked core at chunk size 32) in a
temporary git repository with commits c1; c2, everything computed twice (2x slower); c3, the
output x (1 + 1e-3); c4, a comment. Three
`gdnval gate --backend-repo REPO --head Cn --base c1` runs against one real server (SQLite, the
local executor; the backend name comes from the package's entry point), sharing c1's jobs:
c2 exits 1 naming the backend case's time metric, c3 exits 1 naming its accuracy metric, c4
exits 0 (or 2, on a machine too loaded to decide, only because a confirmation stayed
undecided). Each gate's page shows its verdict, and c1..c4 appear by their own short shas on the
job list and, in commit order, on the history of the backend's repository.

c4 passes with eager's raw times free to move: on a CPU time is judged only through the
reference-relative metrics (raw wall-clock times of a loaded 2-core machine move by up to 2x
between jobs), so the raw ones are shown with their evidence and never judged.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.e2e.test_external_backend import PYPROJECT
from tests.support.gate_outcome import passed_or_undecided
from tests.support.gate_suite import git, serve_in_thread

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]  # three gates, ~15 jobs
BACKEND = "extgdn"
# plain torch through gdn's eager chunked core at chunk size 32 (the per-token recurrence of
# test_external_backend would triple the scenario's minutes on a 2-core machine)
CORE = '''"""The eager chunked GDN core at chunk size 32; autograd gives the backward."""
from gdn import chunk_gated_delta_rule_eager


def core(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    return chunk_gated_delta_rule_eager(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                        chunk_size=32)
'''
TWICE = '''

_core = core


def core(q, k, v, g, beta, **kw):
    """Everything computed twice (the mean of two identical results: the same numbers)."""
    o1, s1 = _core(q, k, v, g, beta, **kw)
    o2, s2 = _core(q, k, v, g, beta, **kw)
    return (o1 + o2) / 2, (None if s1 is None else (s1 + s2) / 2)
'''
SCALED = """

_core = core


def core(q, k, v, g, beta, **kw):
    o, s = _core(q, k, v, g, beta, **kw)
    return o * (1 + 1e-3), s
"""


def make_backend_repo(repo: Path) -> dict[str, str]:
    """c1 right; c2 twice as slow; c3 output x (1 + 1e-3); c4 = c1 plus a comment."""
    (repo / "extgdn").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    git(repo, "init", "-q")
    right = CORE
    shas = {}
    for name, text in (("c1", right), ("c2", right + TWICE), ("c3", right + SCALED),
                       ("c4", "# the per-token recurrence, unchanged\n" + right)):
        (repo / "extgdn" / "__init__.py").write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", name)
        shas[name] = git(repo, "rev-parse", "HEAD")
    return shas


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    from service.executor_choice import close_executors
    from service.settings import Settings

    tmp = tmp_path_factory.mktemp("backend-gate")
    repo = tmp / "mykernel"
    shas = make_backend_repo(repo)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GDNVAL_SNAPSHOT_CACHE", str(tmp / "snapshots"))
        mp.delenv("GDNVAL_REPO", raising=False)
        close_executors()
        settings = Settings(db_url=f"sqlite:///{tmp / 'svc.db'}", artifacts_dir=tmp / "artifacts",
                            executor="local", poll_interval_s=0.5, lease_s=120.0)
        try:
            with serve_in_thread(settings) as url:
                yield SimpleNamespace(url=url, repo=repo, shas=shas, tmp=tmp)
        finally:
            close_executors()


def gate(server: SimpleNamespace, head: str, base: str) -> SimpleNamespace:
    """`gdnval gate --backend-repo REPO --head C2 --base C1`, the command of docs/howto-backend.md
    exactly (the server from GDNVAL_SERVER), in this process; then the stored gate from the API."""
    from click.testing import CliRunner

    from service.cli import main

    t0 = time.monotonic()
    args = ["gate", "--backend-repo", str(server.repo), "--head", head, "--base", base]
    result = CliRunner().invoke(main, args, env={"GDNVAL_SERVER": server.url}, catch_exceptions=False)
    wall = time.monotonic() - t0
    found = re.search(r"/gates/(\d+)\)", result.stdout)
    assert found, result.stdout
    stored = httpx.get(f"{server.url}/api/v1/gates/{found[1]}", timeout=60).json()
    return SimpleNamespace(code=result.exit_code, stdout=result.stdout, gate=stored, wall=wall)


def _worse(g: SimpleNamespace, kind: str) -> set[tuple[str, str]]:
    """(case, metric) of every metric of `kind` the stored gate found regressed, worsened or failed."""
    bad = ("regressed", "worsened", "failed")
    return {(f["case"], f["metric"]) for f in g.gate["findings"] if f["kind"] == kind and f["verdict"] in bad}


def test_a_backend_repository_is_gated_on_its_backend(server: SimpleNamespace) -> None:
    shas, walls = server.shas, {}
    slow = gate(server, shas["c2"], shas["c1"])
    walls["c2 (2x slower) vs c1"] = slow.wall
    assert slow.code == 1, slow.stdout
    assert sorted({j["suite"] for j in slow.gate["jobs"]}) == ["capability", "cp-layer", "gdn-op"]
    backend_times = {m for c, m in _worse(slow, "time") if c.endswith(f"_{BACKEND}")}
    assert backend_times & {"fwd_rel", "fwd_bwd_rel"}, slow.stdout  # its reference-relative time
    assert "❌ FAIL" in slow.stdout and re.search(rf"_{BACKEND}.*fwd(_bwd)?_rel", slow.stdout), slow.stdout
    sides = {j["code_commit"] for j in slow.gate["jobs"] if j["role"] in ("head", "base")}
    assert sides == {shas["c1"], shas["c2"]}  # the backend's commits, resolved in its repository

    scaled = gate(server, shas["c3"], shas["c1"])
    walls["c3 (output x (1 + 1e-3)) vs c1"] = scaled.wall
    assert scaled.code == 1, scaled.stdout
    assert (f"T512_stateful_hqk2_hv4_b1_{BACKEND}", "o_rel_l2") in _worse(scaled, "accuracy"), scaled.stdout
    assert "o_rel_l2" in scaled.stdout
    base_jobs = {j["job_id"] for j in slow.gate["jobs"] if j["role"] == "base"}
    assert {j["job_id"] for j in scaled.gate["jobs"] if j["role"] == "base"} == base_jobs  # c1's, shared
    assert all(j["reused"] for j in scaled.gate["jobs"] if j["role"] == "base")

    comment = gate(server, shas["c4"], shas["c1"])
    walls["c4 (comment) vs c1"] = comment.wall
    assert passed_or_undecided(comment.code, comment.gate), comment.stdout
    comment_verdict = "pass" if comment.code == 0 else "error"  # exit 2: undecided, never failed
    assert ("✅ PASS" if comment.code == 0 else "⚠️ COULD NOT RUN") in comment.stdout
    assert not [f for f in comment.gate["findings"] if f["verdict"] in ("regressed", "worsened", "failed")]
    for g in (slow, scaled, comment):  # a time fails a CPU gate only through a reference-relative one
        assert {m for _, m in _worse(g, "time")} <= {"fwd_rel", "fwd_bwd_rel"}, g.stdout

    with httpx.Client(base_url=server.url, timeout=60) as http:
        for g, verdict in ((slow, "fail"), (scaled, "fail"), (comment, comment_verdict)):
            gid = g.gate["id"]
            assert (g.gate["verdict"], g.gate["exit_code"]) == (verdict, g.code)
            page = http.get(f"/gates/{gid}").text
            assert f'data-gate-verdict="{verdict}"' in page, page[:2000]
            assert f"/gates/{gid}" in g.stdout  # the report links its page
        gates_page = http.get("/gates").text
        assert all(f'href="/gates/{g.gate["id"]}"' in gates_page for g in (slow, scaled, comment))
        jobs_page = http.get("/jobs", params={"suite": "gdn-op"}).text
        for name, sha in shas.items():
            assert f">{sha[:10]}</a>" in jobs_page, name  # each commit by its own short sha
            found = http.get("/api/v1/jobs", params={"commit": sha[:8], "suite": "gdn-op"}).json()["items"]
            assert found and {j["code_commit"] for j in found} == {sha}, name
        assert "installed</span>" not in jobs_page
        fingerprint = next(f["fingerprint"] for f in scaled.gate["findings"]
                           if f["case"] == f"T512_stateful_hqk2_hv4_b1_{BACKEND}")
        history = http.get("/history", params={"fingerprint": fingerprint, "metric": "fwd_rel",
                                               "backend_repo": str(server.repo)}).text
        table = history.index('id="commit-table"')
        at = [history.find(f'<tr data-commit="{sha}"', table) for sha in shas.values()]
        assert -1 not in at and at == sorted(at), history[:3000]  # the backend's commits, in commit order
        pair = {"base_commit": shas["c1"], "head_commit": shas["c4"], "suite": "gdn-op", "preset": "gate-cpu"}
        by_commit = http.get("/api/v1/compare", params=pair)
        assert by_commit.status_code == 200, by_commit.text
        # eager's raw times, free to move: shown with their evidence, never judged on a cpu
        eager = next(c for c in by_commit.json()["cases"] if c["name"] == "T512_stateful_hqk2_hv4_b1_eager")
        raw = {m["metric"]: m for m in eager["metrics"] if m["metric"] in ("fwd_ms", "fwd_bwd_ms")}
        assert set(raw) == {"fwd_ms", "fwd_bwd_ms"}, eager["metrics"]
        assert all(m["verdict"] in ("unchanged", "changed") and "not judged" in m["reason"]
                   for m in raw.values()), raw
    print("backend gate wall times (s):", {k: round(v, 1) for k, v in walls.items()})
