"""A kernel's own repository gated on that kernel, exactly as docs/howto-backend.md says: a
plain-torch chunked gated delta rule of its own (the WY form, chunk by chunk; no call into
gdnval) in a temporary git repository, entry point `extgdn`:

- c1: chunk size 4;
- c2: chunk size 64 — several times faster, every reduction in another order (its element-wise
  max-relative errors move by large factors, its relative-L2 stays ~1e-7): exit 0, and the stored
  gate names the speed-up as an improvement (API and page);
- c3 = c2 + a second call on half the sequence (1.5x the work): exit 1 on the backend's
  reference-relative time;
- c4 = c2 with the output x (1 + 2e-3): within gdn-op's 5e-3 bound but far above the base and
  eager's own error: exit 1 on `o_rel_l2` (worsened);
- c5 = c2 + a README: exit 0 (the backend's code is byte-identical: judged by c2's job, nothing
  runs).

c2 is gated on every suite that calls the backend (as the how-to does); c3..c5 against c2 on
gdn-op, where the verdicts under test live, so the scenario stays within the CI's minutes. One
real server (SQLite, the local executor); c2's jobs are shared by the later gates. The repository
and its store are tests/support/backend_repo.py's, shared with the eager-reuse tests of
tests/service/domain: a job they measured first is reused here as any earlier job is.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from tests.support.backend_repo import CASE, gate, serve_backend_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]


@pytest.fixture(scope="module")
def server(backend_store: SimpleNamespace) -> Iterator[SimpleNamespace]:
    with serve_backend_store(backend_store) as served:
        yield served


def _found(g: SimpleNamespace, change: str) -> set[tuple[str, str]]:
    """(case, metric) of every finding of the stored gate that is a `change` (regression, improvement)."""
    return {(f["case"], f["metric"]) for f in g.gate["findings"] if f["change"] == change}


def test_a_backend_repository_is_gated_on_its_backend(server: SimpleNamespace) -> None:
    shas, walls = server.shas, {}
    faster = gate(server, shas["c2"], shas["c1"])
    walls["c2 (chunk 64) vs c1 (chunk 4)"] = faster.wall
    assert faster.code == 0, faster.stdout
    assert sorted({j["suite"] for j in faster.gate["jobs"]}) == ["capability", "cp-layer", "gdn-op"]
    assert not _found(faster, "regression"), faster.stdout
    improved = {m for c, m in _found(faster, "improvement") if c == CASE}
    assert improved & {"fwd_rel", "fwd_bwd_rel"}, faster.gate["findings"]  # stored, with the API
    assert "improved: gdn-op/" + CASE in faster.gate["reason"] and "### Improvements" in faster.stdout
    assert 'id="gate-improvement"' in faster.page and 'data-change="improvement"' in faster.page
    # the reduction order moved every element-wise max-relative error; they are recorded, never judged
    pair = {"base_commit": shas["c1"], "head_commit": shas["c2"], "suite": "gdn-op", "preset": "gate-cpu"}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        compared = http.get("/api/v1/compare", params=pair)
        assert compared.status_code == 200, compared.text
        mine = next(c for c in compared.json()["cases"] if c["name"] == CASE)
        diag = {m["metric"]: m for m in mine["metrics"] if m["metric"].endswith(("_max_rel", "_max_abs"))}
        assert diag and all(m["verdict"] in ("changed", "unchanged") for m in diag.values()), diag
        assert all(m["diagnostic"] for m in diag.values())
        assert {m["metric"]: m["verdict"] for m in mine["metrics"]}["o_rel_l2"] == "unchanged"

    slower = gate(server, shas["c3"], shas["c2"], "gdn-op")
    walls["c3 (1.5x the work) vs c2"] = slower.wall
    assert slower.code == 1, slower.stdout
    regressed = {m for c, m in _found(slower, "regression") if c == CASE}
    assert regressed & {"fwd_rel", "fwd_bwd_rel"}, slower.stdout
    assert "❌ FAIL" in slower.stdout and "### Regressions" in slower.stdout

    scaled = gate(server, shas["c4"], shas["c2"], "gdn-op")
    walls["c4 (output x (1 + 2e-3)) vs c2"] = scaled.wall
    assert scaled.code == 1, scaled.stdout
    worsened = {(f["case"], f["metric"]): f for f in scaled.gate["findings"] if f["verdict"] == "worsened"}
    assert (CASE, "o_rel_l2") in worsened, scaled.gate["findings"]
    assert "eager reference" in worsened[(CASE, "o_rel_l2")]["reason"]  # measured against eager's own error
    c2_jobs = {j["job_id"] for j in faster.gate["jobs"] if j["role"] == "head" and j["suite"] == "gdn-op"}
    assert {j["job_id"] for j in scaled.gate["jobs"] if j["role"] == "base"} == c2_jobs  # c2's, shared

    docs = gate(server, shas["c5"], shas["c2"], "gdn-op")
    walls["c5 (a README) vs c2"] = docs.wall
    assert docs.code == 0, docs.stdout
    assert not _found(docs, "regression") and "✅ PASS" in docs.stdout
    head = next(j for j in docs.gate["jobs"] if j["role"] == "head")  # the package is byte-identical:
    assert head["reused"] and head["code_commit"] == shas["c2"], docs.gate["jobs"]  # c2's job, nothing run

    with httpx.Client(base_url=server.url, timeout=60) as http:
        for g, verdict in ((faster, "pass"), (slower, "fail"), (scaled, "fail"), (docs, "pass")):
            assert (g.gate["verdict"], g.gate["exit_code"]) == (verdict, g.code)
            assert f'data-gate-verdict="{verdict}"' in g.page, g.page[:2000]
            assert f"/gates/{g.gate['id']}" in g.stdout  # the report links its page
        jobs_page = http.get("/jobs", params={"suite": "gdn-op"}).text
        for name, sha in ((n, shas[n]) for n in ("c1", "c2", "c3", "c4", "c5")):
            found = http.get("/api/v1/jobs", params={"commit": sha[:8], "suite": "gdn-op"}).json()["items"]
            if name == "c5":  # judged by c2's job: none of its own
                assert not found and f">{sha[:10]}</a>" not in jobs_page, found
                continue
            assert f">{sha[:10]}</a>" in jobs_page, name  # each commit by its own short sha
            assert found and {j["code_commit"] for j in found} == {sha}, name
        assert "installed</span>" not in jobs_page
    print("backend gate wall times (s):", {k: round(v, 1) for k, v in walls.items()})
