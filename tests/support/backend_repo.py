"""The backend repository of the backend-gate tests (tests/e2e/test_backend_gate.py,
tests/service/domain/test_gate_eager_reuse.py): a plain-torch chunked gated delta rule (`extgdn`,
the WY form, no call into gdnval) in a git repository, and the store its gates run against.

Both test modules gate the same commits with the same settings, so they share one repository and
one store (SQLite, artifacts, snapshot cache) for the session: each module starts its own server
on it (module-scoped, its environment and executors its own), and a job one module measured is
reused by the other exactly as a gate reuses any earlier job of that commit. Every test passes
alone as well: a job not in the store yet is measured.

Commits:
- c1: chunk size 4;
- c2: chunk size 64;
- c3 = c2 + a second call on half the sequence (1.5x the work);
- c4 = c2 with the output x (1 + 2e-3);
- c5 = c2 + a README (the package byte-identical to c2's);
- c6 = c4 + a comment (another content hash);
- c7 = c2 + a comment (another content hash: a job of its own, used by the eager-reuse tests
  alone, whose assertions need a head job made by their own gate).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.support.gate_suite import git, serve_in_thread

PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "ext-gdn"
version = "0.2.0"

[project.entry-points."gdnval.backends"]
extgdn = "extgdn:core"
"""

BACKEND = "extgdn"
CASE = f"T512_stateful_hqk2_hv4_b1_{BACKEND}"
# The toy backends' entry: the packed batch split into its sequences, then the shapes every
# core reads; each toy core (below, tests/e2e/test_external_backend.py) goes on from there.
CORE_PROLOGUE = '''\
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
'''
CORE = '''"""A chunked gated delta rule in plain torch (the WY form); autograd gives the backward."""
import torch

CHUNK = 4


''' + CORE_PROLOGUE + '''    C = CHUNK
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
    """c1 chunk 4; c2 chunk 64; c3, c4, c5, c7 on top of c2 (slower, scaled, a README, a
    comment); c6 on top of c4 (a comment)."""
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

    def branch(name: str, at: str) -> None:
        git(repo, "checkout", "-q", shas[at])
        git(repo, "checkout", "-q", "-b", name)

    fast = CORE.replace("CHUNK = 4", "CHUNK = 64")
    assert fast != CORE
    commit("c1", CORE)
    commit("c2", fast)
    commit("c3", fast + HALF_AGAIN)
    branch("scaled", "c2")
    commit("c4", fast + SCALED)
    commit("c6", fast + SCALED + "# c6\n")
    branch("docs", "c2")
    (repo / "README.md").write_text("# extgdn\n\nA chunked gated delta rule in plain torch.\n")
    commit("c5")
    branch("comment", "c2")
    commit("c7", fast + "# c7\n")
    return shas


def make_backend_store(tmp: Path) -> SimpleNamespace:
    """The repository (`tmp`/mykernel) and where the servers on it keep their store."""
    repo = tmp / "mykernel"
    return SimpleNamespace(repo=repo, shas=make_backend_repo(repo), tmp=tmp, db=tmp / "svc.db")


@contextlib.contextmanager
def serve_backend_store(store: SimpleNamespace) -> Iterator[SimpleNamespace]:
    """A real server (SQLite, the local executor) on `store`, with executors and environment of
    its own for as long as the block runs; yields `store` with its `url`."""
    from service.executor_choice import close_executors
    from service.settings import Settings

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GDNVAL_SNAPSHOT_CACHE", str(store.tmp / "snapshots"))
        mp.delenv("GDNVAL_REPO", raising=False)
        close_executors()
        settings = Settings(db_url=f"sqlite:///{store.db}", artifacts_dir=store.tmp / "artifacts",
                            executor="local", poll_interval_s=0.5, lease_s=120.0)
        try:
            with serve_in_thread(settings) as url:
                yield SimpleNamespace(**vars(store), url=url)
        finally:
            close_executors()


def gate(server: SimpleNamespace, head: str, base: str, *suites: str, fresh: bool = False) -> SimpleNamespace:
    """`gdnval gate --backend-repo REPO --head C2 --base C1`, the command of docs/howto-backend.md
    exactly (the server from GDNVAL_SERVER; `suites`: `--suite` each; `fresh`: `--fresh`, both
    sides measured anew), in this process; then the stored gate from the API and its page."""
    from click.testing import CliRunner

    from service.cli import main

    t0 = time.monotonic()
    args = ["gate", "--backend-repo", str(server.repo), "--head", head, "--base", base]
    args += [a for s in suites for a in ("--suite", s)] + (["--fresh"] if fresh else [])
    result = CliRunner().invoke(main, args, env={"GDNVAL_SERVER": server.url}, catch_exceptions=False)
    wall = time.monotonic() - t0
    found = re.search(r"/gates/(\d+)\)", result.stdout)
    assert found, result.stdout
    stored = httpx.get(f"{server.url}/api/v1/gates/{found[1]}", timeout=60).json()
    page = httpx.get(f"{server.url}/gates/{found[1]}", timeout=60).text
    return SimpleNamespace(code=result.exit_code, stdout=result.stdout, gate=stored, page=page, wall=wall)
