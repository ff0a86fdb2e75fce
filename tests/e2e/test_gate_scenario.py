"""The verdict scenario end to end: `gdnval gate` (the CLI) against a real server that runs the
real gdn-op suite (its CPU gate preset, the eager core) on snapshots of real commits.

A temporary repository holds this project's runtime code, committed as: A; B, a comment-only
change; C, the eager GDN forward computed twice (a 2x slow-down of the forward); D, the output
multiplied by 1 + 1e-3. The gate must pass B, fail C naming the time metric, fail D through the
declared accuracy rule (worse by more than 2x), and pass a commit against itself, measured anew,
in 10 of 10 runs (the false-alarm rate, recorded in docs/benchmarks.md with the wall times): 10
gates, each a new job of B against the B job before it. B's gate may instead say it could not
decide (exit 2, never 1) in one case only: a time false alarm whose confirmation pair stays beyond
the minimum effect but not significant after its rounds (a machine under heavy load).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.gate_outcome import passed_or_undecided
from tests.support.gate_suite import git, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
EAGER = Path("gdn") / "backends" / "eager.py"  # the module the `eager` backend's entry comes from
# Each planted change is appended to that module: a re-definition of `eager_core` around the
# original (appended code needs no anchor in the code it changes).
TWICE = """

_eager_core = eager_core


def eager_core(q, k, v, g, beta, **kw):
    \"\"\"The forward computed twice, the first result dropped (a 2x slow-down).\"\"\"
    _eager_core(q, k, v, g, beta, **kw)
    return _eager_core(q, k, v, g, beta, **kw)
"""
SCALED = """

_eager_core = eager_core


def eager_core(q, k, v, g, beta, **kw):
    \"\"\"The output x (1 + 1e-3).\"\"\"
    o, state = _eager_core(q, k, v, g, beta, **kw)
    return o * (1 + 1e-3), state
"""
# eager only: the scenario is about the eager core; the interpreter would only add minutes
GATE_PARAMS = ("--param", 'backends=["eager"]')


def make_scenario_repo(path: Path) -> dict[str, str]:
    """A, B (comment only), C (forward twice), D (output x (1 + 1e-3)) on top of each other's parent."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("gdn", "kernels", "workers"):
        shutil.copytree(ROOT / pkg, path / pkg, ignore=ignore)
    eager = path / EAGER
    src = eager.read_text()
    assert "\ndef eager_core(" in src, f"the eager backend's entry left {EAGER}; update the scenario"
    git(path, "init", "-q")
    shas: dict[str, str] = {}

    def commit(name: str, text: str) -> None:
        eager.write_text(text)
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", name)
        shas[name] = git(path, "rev-parse", "HEAD")

    commit("A", src)
    commit("B", src + "\n# the eager backend: autograd through chunks\n")
    commit("C", src + TWICE)
    commit("D", src + SCALED)
    return shas


PLANT_CHECK = """
import json, torch, gdn
torch.manual_seed(0)
q, k = torch.randn(1, 70, 1, 8), torch.nn.functional.normalize(torch.randn(1, 70, 1, 8), dim=-1)
v, g, b = torch.randn(1, 70, 2, 8), -torch.rand(1, 70, 2), torch.rand(1, 70, 2)
o, _ = gdn.gated_delta_rule(q, k, v, g, b)
ref, _ = gdn.chunk_gated_delta_rule_eager(q, k, v, g, b)
print(json.dumps({"doc": gdn.get_backend("eager").fn.__doc__, "ratio": (o / ref).mean().item()}))
"""


@pytest.mark.parametrize("plant", ["TWICE", "SCALED"])
def test_a_planted_change_is_what_the_eager_backend_runs(plant: str, tmp_path: Path) -> None:
    """The appended re-definition replaces the `eager` backend's entry (and only it: the
    reference the accuracy is measured against stays), in a fresh interpreter as the jobs' ranks."""
    shutil.copytree(ROOT / "gdn", tmp_path / "gdn", ignore=shutil.ignore_patterns("__pycache__"))
    text = globals()[plant]
    (tmp_path / EAGER).write_text((tmp_path / EAGER).read_text() + text)
    out = subprocess.run([sys.executable, "-c", PLANT_CHECK], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["doc"] in text
    assert found["ratio"] == pytest.approx(1 + 1e-3 if plant == "SCALED" else 1.0, rel=1e-5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    from service.executor_choice import close_executors
    from service.settings import Settings

    tmp = tmp_path_factory.mktemp("scenario")
    repo = tmp / "repo"
    repo.mkdir()
    shas = make_scenario_repo(repo)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GDNVAL_REPO", str(repo))
        mp.setenv("GDNVAL_SNAPSHOT_CACHE", str(tmp / "snapshots"))
        close_executors()
        settings = Settings(db_url=f"sqlite:///{tmp / 'svc.db'}", artifacts_dir=tmp / "artifacts",
                            executor="local", poll_interval_s=0.5, lease_s=120.0)
        try:
            with serve_in_thread(settings) as url:
                yield SimpleNamespace(url=url, repo=repo, shas=shas, tmp=tmp)
        finally:
            close_executors()


def gate(server: SimpleNamespace, head: str, base: str, *extra: str) -> SimpleNamespace:
    """`gdnval gate` in this process (the real command, over HTTP); returns exit code, output, JSON."""
    from click.testing import CliRunner

    from service.cli import main

    out = server.tmp / f"gate-{time.monotonic_ns()}.json"
    t0 = time.monotonic()
    result = CliRunner().invoke(main, [
        "gate", "--head", head, "--base", base, "--suite", "gdn-op", "--repo", str(server.repo),
        "--server", server.url, "--poll", "0.3", "--json", str(out), *GATE_PARAMS, *extra,
    ], catch_exceptions=False)
    data = json.loads(out.read_text()) if out.exists() else {}
    return SimpleNamespace(code=result.exit_code, stdout=result.stdout, data=data, wall=time.monotonic() - t0)


def _metrics(data: dict, verdict: str) -> set[str]:
    return {m["metric"] for cmp in data["comparisons"] for c in cmp["cases"] for m in c["metrics"]
            if m["verdict"] == verdict}


@pytest.mark.slow
def test_gate_scenario_comment_slowdown_perturbation_and_false_alarms(server: SimpleNamespace) -> None:
    shas = server.shas
    walls: dict[str, float] = {}

    comment = gate(server, shas["B"], shas["A"])
    walls["comment-only"] = comment.wall
    assert passed_or_undecided(comment.code, comment.data), comment.stdout
    assert comment.data["comparisons"][0]["head"]["preset"] == "gate-cpu"  # the CPU gate preset

    slow = gate(server, shas["C"], shas["B"])
    walls["2x forward"] = slow.wall
    assert slow.code == 1, slow.stdout
    # judged on the reference-relative time (the wall clock of a shared CPU counts from 2x only)
    assert "fwd_rel" in _metrics(slow.data, "regressed"), slow.stdout
    assert "fwd_rel" in slow.stdout and "❌ FAIL" in slow.stdout

    perturbed = gate(server, shas["D"], shas["B"])
    walls["output x (1+1e-3)"] = perturbed.wall
    assert perturbed.code == 1, perturbed.stdout
    assert "o_rel_l2" in _metrics(perturbed.data, "worsened"), perturbed.stdout

    # B against itself 10 times, each a new head job (`--fresh`) against the B job before it
    # (first the comment-only gate's head): every gate compares two distinct jobs, each measured
    # in processes of its own, of one commit, as a false alarm needs; 10 jobs instead of 20
    codes, seen = [], set()
    last_head = next(j["job_id"] for j in comment.data["jobs"] if j["role"] == "head")
    for _ in range(10):
        same = gate(server, shas["B"], f"job:{last_head}", "--fresh")
        codes.append(same.code)
        walls.setdefault("self (each)", same.wall)
        assert same.code == 0, same.stdout  # a false alarm
        role = {j["role"]: j for j in same.data["jobs"] if j["role"] in ("head", "base")}
        head, base = role["head"]["job_id"], role["base"]["job_id"]
        assert role["base"]["commit"] == role["head"]["commit"] == shas["B"]
        assert base == last_head and head not in seen | {base}  # measured anew against the last one
        assert not role["head"]["reused"]
        seen |= {head, base}
        last_head = head
    assert codes == [0] * 10 and len(seen) == 11
    print("gate scenario wall times (s):", {k: round(v, 1) for k, v in walls.items()})


def default_gate(server: SimpleNamespace, head: str) -> SimpleNamespace:
    """README's default gate, `gdnval gate --head H --base H~1` (on the CPU by default: every suite
    that runs on one CPU rank, each with its gate-cpu preset), over HTTP in this process."""
    from click.testing import CliRunner

    from service.cli import main

    out = server.tmp / f"default-gate-{time.monotonic_ns()}.json"
    t0 = time.monotonic()
    result = CliRunner().invoke(main, [
        "gate", "--head", head, "--base", f"{head}~1",
        "--repo", str(server.repo), "--server", server.url, "--poll", "0.3", "--json", str(out),
    ], catch_exceptions=False)
    data = json.loads(out.read_text()) if out.exists() else {}
    return SimpleNamespace(code=result.exit_code, stdout=result.stdout, data=data, wall=time.monotonic() - t0)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # two gates of every suite's gate-cpu jobs (docs/benchmarks.md, the CPU gate)
def test_default_cpu_gate_passes_a_comment_and_fails_a_doubled_forward(server: SimpleNamespace) -> None:
    shas = server.shas
    comment = default_gate(server, shas["B"])
    assert passed_or_undecided(comment.code, comment.data), comment.stdout
    suites = {cmp["suite"] for cmp in comment.data["comparisons"]}
    assert suites == {"capability", "cp-layer", "gdn-op", "network", "profile"}, suites
    assert all(cmp["head"]["preset"] == "gate-cpu" for cmp in comment.data["comparisons"])
    verdicts = {c["verdict"] for cmp in comment.data["comparisons"] for c in cmp["cases"]}
    assert not verdicts & {"errored", "failed", "regressed", "worsened"}, verdicts

    slow = default_gate(server, shas["C"])
    assert slow.code == 1, slow.stdout
    regressed = {(cmp["suite"], m["metric"]) for cmp in slow.data["comparisons"] for c in cmp["cases"]
                 for m in c["metrics"] if m["verdict"] == "regressed"}
    assert ("gdn-op", "fwd_rel") in regressed, slow.stdout
    # raw wall clock on a cpu is shown, never judged
    assert not {metric for _, metric in regressed} - {"fwd_rel", "fwd_bwd_rel"}, regressed
    print("default CPU gate wall times (s):", {"comment-only": round(comment.wall, 1),
                                                "2x forward": round(slow.wall, 1)})
