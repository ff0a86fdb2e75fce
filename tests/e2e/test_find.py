"""`gdnval find` end to end, through the CLI and a real server (SQLite, the local executor) on
real commits: c1 good, c2 documentation only, c3 1.6x slower, c4 and c5 documentation only.

For a backend's own repository (an `extgdn` package: gdn's eager chunked core at chunk size 32,
gated on gdn-op) and for the project's repository (its runtime code with the test-only `gatetime`
suite, whose sleeps the planted change lengthens), `gdnval find --good c1 --bad c5` names c3,
measures at most 5 commits (c2 and c3 reuse the jobs of the byte-identical c1 and c5 before the
boundary is measured anew), and its page shows its steps; the repository's history then lists
c1..c5 once each in commit order with c3's change marked. `--no-confirm`: the steps gate
without the CPU gate's confirmation pair; the find's boundary step measures both commits anew.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from tests.support.backend_repo import PYPROJECT
from tests.support.gate_suite import SUITE_MODULE, git, serve_in_thread

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
NAMES = ("c1", "c2", "c3", "c4", "c5")
CORE = '''"""The eager chunked GDN core at chunk size 32; autograd gives the backward."""
from gdn import chunk_gated_delta_rule_eager


def core(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    return chunk_gated_delta_rule_eager(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                        chunk_size=32)
'''
# the core, then the core again over the first 60 % of the sequence (its output added times 0, so
# the backward pays for it too): 1.6x the time, the same numbers
SLOWER = '''

_core = core


def core(q, k, v, g, beta, **kw):
    o, s = _core(q, k, v, g, beta, **kw)
    t = q.shape[1] * 6 // 10
    extra, _ = _core(q[:, :t], k[:, :t], v[:, :t], g[:, :t], beta[:, :t], **{**kw, "cu_seqlens": None})
    return o + 0.0 * extra.sum(), s
'''


def commit_five(repo: Path, write_code: Callable[[str], None]) -> dict[str, str]:
    """c1..c5 in `repo` (initialised): `write_code(name)` writes the code of each; every commit
    also rewrites README.md, so c2, c4 and c5 change nothing but it."""
    shas = {}
    for name in NAMES:
        write_code(name)
        (repo / "README.md").write_text(f"notes as of {name}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"{name}: {'slower' if name == 'c3' else 'notes'}")
        shas[name] = git(repo, "rev-parse", "HEAD")
    return shas


def backend_repo(repo: Path) -> dict[str, str]:
    """The `extgdn` package: c3 onwards 1.6x slower."""
    (repo / "extgdn").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    git(repo, "init", "-q")
    return commit_five(repo, lambda name: (repo / "extgdn" / "__init__.py").write_text(
        CORE + (SLOWER if name in ("c3", "c4", "c5") else "")))


def project_repo(repo: Path) -> dict[str, str]:
    """Our runtime code and the `gatetime` suite: c3 onwards its sleeps 1.6x longer."""
    from tests.support.repos import copy_runtime

    suite_file = copy_runtime(repo, Path(__file__).resolve().parents[1] / "support" / "gate_suite.py")
    src = suite_file.read_text()
    git(repo, "init", "-q")
    return commit_five(repo, lambda name: suite_file.write_text(
        src.replace("SLOW_FACTOR = 1.0  #", "SLOW_FACTOR = 1.6  #") if name in ("c3", "c4", "c5") else src))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., SimpleNamespace]]:
    """A server (SQLite, the local executor) started on demand: for the project's repository
    (GDNVAL_REPO set, `gatetime` registered) or without one (a backend's repository)."""
    from service.executor_choice import close_executors
    from service.settings import Settings
    from workers.registry import SUITE_MODULES, get_suite

    with pytest.MonkeyPatch.context() as mp, ExitStack() as stack:
        def start(repo: Path | None) -> str:
            mp.setenv("GDNVAL_SNAPSHOT_CACHE", str(tmp_path / "snapshots"))
            if repo is None:
                mp.delenv("GDNVAL_REPO", raising=False)
            else:
                mp.setenv("GDNVAL_REPO", str(repo))
                mp.setitem(SUITE_MODULES, "gatetime", SUITE_MODULE)
                get_suite.cache_clear()
            close_executors()  # an executor cached by another test would not know this repository
            settings = Settings(db_url=f"sqlite:///{tmp_path / 'svc.db'}", executor="local",
                                artifacts_dir=tmp_path / "artifacts", poll_interval_s=0.3, lease_s=120.0)
            return stack.enter_context(serve_in_thread(settings))

        stack.callback(close_executors)
        yield start
    get_suite.cache_clear()


def find(url: str, tmp: Path, *args: str) -> SimpleNamespace:
    """`gdnval find ARGS --no-confirm` in this process (the real command over HTTP)."""
    from service.cli import main

    out = tmp / f"find-{time.monotonic_ns()}.json"
    t0 = time.monotonic()
    result = CliRunner().invoke(main, ["find", *args, "--no-confirm", "--server", url, "--poll", "0.3",
                                       "--json", str(out)], catch_exceptions=False)
    return SimpleNamespace(code=result.exit_code, stdout=result.stdout, wall=time.monotonic() - t0,
                           state=json.loads(out.read_text()) if out.exists() else {})


def check_find(url: str, shas: dict[str, str], found: SimpleNamespace, history: dict[str, Any]) -> None:
    """c3 named, at most 5 commits measured, the steps on the find's page, c2 and c3 judged by
    the jobs of the byte-identical c1 and c5, and the history in commit order with c3 marked."""
    assert found.code == 1, found.stdout
    state = found.state
    assert state["first_bad"] == shas["c3"] and state["last_good"] == shas["c2"], found.stdout
    assert f"first bad commit: {shas['c3']} c3: slower" in found.stdout
    assert len(state["measured"]) <= 5 and state["bound"] == 4, state["measured"]
    bad = ("regressed", "worsened", "failed")
    assert state["findings"] and all(f["verdict"] in bad for f in state["findings"]), state["findings"]
    assert any(f["kind"] == "time" for f in state["findings"]), state["findings"]  # the time that moved
    with httpx.Client(base_url=url, timeout=60) as http:
        stored = http.get(f"/api/v1/finds/{state['find_id']}").json()
        page = http.get(f"/finds/{state['find_id']}").text
    kinds = [(s["kind"], s["commit"], s["outcome"]) for s in stored["steps"]]
    assert kinds == [("verify", shas["c5"], "bad"), ("bisect", shas["c3"], "bad"),
                     ("bisect", shas["c2"], "good"), ("confirm", shas["c3"], "bad")], kinds
    for step, twin in ((1, "c5"), (2, "c1")):  # byte-identical code: the twin's job, reused
        head = next(j for j in stored["steps"][step]["jobs"] if j["role"] == "head")
        assert head["reused"] and head["code_commit"] == shas[twin], stored["steps"][step]
    assert all(f'<tr data-commit="{s[1]}" data-outcome="{s[2]}">' in page for s in kinds), page[:3000]
    listed = [c["commit"] for c in history["commits"]]
    assert listed == [shas[n] for n in NAMES], listed
    marked = {c["commit"]: c["verdict"] for c in history["commits"]}
    assert marked[shas["c3"]] in bad, history["commits"]
    assert all(marked[shas[n]] in (None, "unchanged", "changed") for n in ("c1", "c2", "c4", "c5")), marked


def test_find_in_a_backend_repository(served, tmp_path: Path) -> None:
    repo = tmp_path / "mykernel"
    shas = backend_repo(repo)
    url = served(None)
    found = find(url, tmp_path, "--backend-repo", str(repo), "--good", shas["c1"], "--bad", shas["c5"],
                 "--suite", "gdn-op")
    history = httpx.get(f"{url}/api/v1/history", params={"suite": "gdn-op", "backend_repo": str(repo)},
                        timeout=120).json()
    check_find(url, shas, found, history)
    print(f"find in a backend repository: {found.wall:.1f} s, measured {len(found.state['measured'])}")


def test_find_in_the_project_repository(served, tmp_path: Path) -> None:
    repo = tmp_path / "project"
    repo.mkdir()
    shas = project_repo(repo)
    url = served(repo)
    found = find(url, tmp_path, "--repo", str(repo), "--good", "HEAD~4", "--bad", "HEAD",
                 "--suite", "gatetime")
    history = httpx.get(f"{url}/api/v1/history", params={"suite": "gatetime"}, timeout=120).json()
    check_find(url, shas, found, history)
    print(f"find in the project's repository: {found.wall:.1f} s, measured {len(found.state['measured'])}")
