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
real server (SQLite, the local executor); c2's jobs are shared by the later gates.
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
from tests.support.gate_suite import git, serve_in_thread

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]
BACKEND = "extgdn"
CASE = f"T512_stateful_hqk2_hv4_b1_{BACKEND}"
CORE = '''"""A chunked gated delta rule in plain torch (the WY form); autograd gives the backward."""
import torch

CHUNK = 4


def core(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    if cu_seqlens is not None:
        cu = cu_seqlens.tolist()
        outs, finals = [], []
        for i in range(len(cu) - 1):
            a, b = cu[i], cu[i + 1]
            h0 = None if initial_state is None else initial_state[i : i + 1]
            o, s = core(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], scale=scale,
                        initial_state=h0, output_final_state=True)
            outs.append(o)
            finals.append(s)
        return torch.cat(outs, 1), (torch.cat(finals, 0) if output_final_state else None)
    B, T, hq, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    dt = torch.float64 if v.dtype == torch.float64 else torch.float32
    scale = dk ** -0.5 if scale is None else scale
    C = CHUNK
    pad = (-T) % C
    def heads(x, rep):  # [B, T, H, D] -> [B, Hv, T + pad, D]
        x = x.to(dt).repeat_interleave(rep, dim=2) if rep > 1 else x.to(dt)
        return torch.nn.functional.pad(x.transpose(1, 2), (0, 0, 0, pad))
    qh, kh, vh = heads(q, hv // hq), heads(k, hv // hq), heads(v, 1)
    gh = torch.nn.functional.pad(g.to(dt).transpose(1, 2), (0, pad))
    bh = torch.nn.functional.pad(beta.to(dt).transpose(1, 2), (0, pad))
    n = (T + pad) // C
    qc, kc, vc = (x.reshape(B, hv, n, C, -1) for x in (qh * scale, kh, vh))
    gc = gh.reshape(B, hv, n, C).cumsum(-1)
    bc = bh.reshape(B, hv, n, C)
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    a = (bc[..., None] * (kc @ kc.transpose(-1, -2))) * decay
    eye = torch.eye(C, dtype=dt, device=q.device)
    t_inv = torch.linalg.solve_triangular(eye + a, eye.expand_as(a), upper=False)
    u = t_inv @ (bc[..., None] * vc)
    w = t_inv @ (bc[..., None] * kc * gc[..., None].exp())
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    inner = (gc[..., :, None] - gc[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    S = (initial_state.to(dt) if initial_state is not None
         else q.new_zeros(B, hv, dk, dv, dtype=dt))
    outs = []
    for i in range(n):
        vn = u[:, :, i] - w[:, :, i] @ S
        qi, ki, gi = qc[:, :, i], kc[:, :, i], gc[:, :, i]
        outs.append((qi * gi[..., None].exp()) @ S + ((qi @ ki.transpose(-1, -2)) * inner[:, :, i]) @ vn)
        last = gi[..., -1:]
        S = S * last[..., None].exp() + (ki * (last - gi)[..., None].exp()).transpose(-1, -2) @ vn
    o = torch.cat(outs, 2)[:, :, :T].transpose(1, 2)
    return o.to(v.dtype), (S if output_final_state else None)
'''
HALF_AGAIN = """

_core = core


def core(q, k, v, g, beta, **kw):
    \"\"\"Also runs the first half of the sequence once more (its result unused): 1.5x the work.\"\"\"
    o, s = _core(q, k, v, g, beta, **kw)
    half = q.shape[1] // 2
    extra, _ = _core(q[:, :half], k[:, :half], v[:, :half], g[:, :half], beta[:, :half],
                     **{**kw, "output_final_state": False})
    return o + 0.0 * extra.sum(), s
"""
SCALED = """

_core = core


def core(q, k, v, g, beta, **kw):
    o, s = _core(q, k, v, g, beta, **kw)
    return o * (1 + 2e-3), s
"""


def make_backend_repo(repo: Path) -> dict[str, str]:
    """c1 chunk 4; c2 chunk 64; c3, c4, c5 on top of c2 (slower, scaled, a README)."""
    (repo / "extgdn").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    git(repo, "init", "-q")
    shas: dict[str, str] = {}

    def commit(name: str, text: str | None = None) -> None:
        if text is not None:
            (repo / "extgdn" / "__init__.py").write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", name)
        shas[name] = git(repo, "rev-parse", "HEAD")

    fast = CORE.replace("CHUNK = 4", "CHUNK = 64")
    assert fast != CORE
    commit("c1", CORE)
    commit("c2", fast)
    commit("c3", fast + HALF_AGAIN)
    git(repo, "checkout", "-q", shas["c2"])
    git(repo, "checkout", "-q", "-b", "scaled")
    commit("c4", fast + SCALED)
    git(repo, "checkout", "-q", shas["c2"])
    git(repo, "checkout", "-q", "-b", "docs")
    (repo / "README.md").write_text("# extgdn\n\nA chunked gated delta rule in plain torch.\n")
    commit("c5")
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


def gate(server: SimpleNamespace, head: str, base: str, *suites: str) -> SimpleNamespace:
    """`gdnval gate --backend-repo REPO --head C2 --base C1`, the command of docs/howto-backend.md
    exactly (the server from GDNVAL_SERVER; `suites`: `--suite` each), in this process; then the
    stored gate from the API and its page."""
    from click.testing import CliRunner

    from service.cli import main

    t0 = time.monotonic()
    args = ["gate", "--backend-repo", str(server.repo), "--head", head, "--base", base]
    args += [a for s in suites for a in ("--suite", s)]
    result = CliRunner().invoke(main, args, env={"GDNVAL_SERVER": server.url}, catch_exceptions=False)
    wall = time.monotonic() - t0
    found = re.search(r"/gates/(\d+)\)", result.stdout)
    assert found, result.stdout
    stored = httpx.get(f"{server.url}/api/v1/gates/{found[1]}", timeout=60).json()
    page = httpx.get(f"{server.url}/gates/{found[1]}", timeout=60).text
    return SimpleNamespace(code=result.exit_code, stdout=result.stdout, gate=stored, page=page, wall=wall)


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
        for name, sha in shas.items():
            found = http.get("/api/v1/jobs", params={"commit": sha[:8], "suite": "gdn-op"}).json()["items"]
            if name == "c5":  # judged by c2's job: none of its own
                assert not found and f">{sha[:10]}</a>" not in jobs_page, found
                continue
            assert f">{sha[:10]}</a>" in jobs_page, name  # each commit by its own short sha
            assert found and {j["code_commit"] for j in found} == {sha}, name
        assert "installed</span>" not in jobs_page
    print("backend gate wall times (s):", {k: round(v, 1) for k, v in walls.items()})
