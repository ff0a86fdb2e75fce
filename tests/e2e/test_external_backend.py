"""A backend from someone else's repository, end to end on the CPU: a small package written here
(a plain-torch per-token recurrence, autograd for the backward) in a git repository with two
commits, the second numerically wrong; installed per commit into a folder of its own
(workers.backend_source), found through its `gdnval.backends` entry point, and run by gdn-op's
quick preset beside `eager` in the jobs of a real gate between the two commits (the service on
SQLite, the local executor), which fails."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.backend_repo import CORE_PROLOGUE, PYPROJECT
from tests.support.suites import RecordingSink
from workers.backend_source import BackendSource, BackendSourceError, install_backend_source
from workers.executors.base import JobSpec
from workers.executors.local import LocalExecutor
from workers.provenance import BACKEND_COMMIT_FILE

pytestmark = pytest.mark.slow

CORE = '''"""A per-token gated delta rule in plain torch; autograd gives the backward."""
import torch


''' + CORE_PROLOGUE + '''    qh = q.to(dt).repeat_interleave(hv // hq, dim=2)
    kh = k.to(dt).repeat_interleave(hv // hq, dim=2)
    S = initial_state.to(dt) if initial_state is not None else q.new_zeros(B, hv, dk, dv, dtype=dt)
    outs = []
    for t in range(T):
        S = S * DECAY(g[:, t].to(dt))[..., None, None]
        err = v[:, t].to(dt) - torch.einsum("bhk,bhkv->bhv", kh[:, t], S)
        S = S + torch.einsum("bhk,bhv->bhkv", kh[:, t], beta[:, t].to(dt)[..., None] * err)
        outs.append(torch.einsum("bhk,bhkv->bhv", qh[:, t], S) * scale)
    return torch.stack(outs, 1).to(v.dtype), (S if output_final_state else None)
'''
RIGHT = "def DECAY(g):\n    return g.exp()\n"
WRONG = "def DECAY(g):\n    return (0.5 * g).exp()  # the gate half applied\n"


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def ext_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    repo = tmp_path_factory.mktemp("ext-gdn")
    (repo / "extgdn").mkdir()
    (repo / "pyproject.toml").write_text(PYPROJECT)
    _git(repo, "init", "-q")
    shas = []
    for decay, msg in ((RIGHT, "right"), (WRONG, "wrong")):
        (repo / "extgdn" / "__init__.py").write_text(CORE + "\n\n" + decay)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", msg)
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return repo, shas[0], shas[1]


def _job(cache: Path, source: str, params: dict) -> RecordingSink:
    """A gdn-op quick job with this backend source on the real local executor."""
    sink = RecordingSink()
    spec = JobSpec(job_id=1, suite="gdn-op", preset="quick", params=params, deadline_s=300.0,
                   backend_source=source)
    sink.outcome = LocalExecutor(cache_dir=cache / "snapshots").run(spec, sink, threading.Event())  # type: ignore[attr-defined]
    return sink


def test_each_commit_installs_once_into_a_folder_of_its_own(ext_repo, tmp_path: Path) -> None:
    repo, right, wrong = ext_repo
    site = install_backend_source(f"git+{repo}@{right[:10]}", tmp_path / "backends")
    assert (site / BACKEND_COMMIT_FILE).read_text().strip() == right
    assert (site / "extgdn" / "__init__.py").read_text().endswith(RIGHT)
    stamp = (site / BACKEND_COMMIT_FILE).stat().st_mtime_ns
    assert install_backend_source(f"git+{repo}@{right}", tmp_path / "backends") == site  # cached
    assert (site / BACKEND_COMMIT_FILE).stat().st_mtime_ns == stamp
    other = install_backend_source(f"git+{repo}@{wrong}", tmp_path / "backends")
    assert other != site and (other / "extgdn" / "__init__.py").read_text().endswith(WRONG)


def test_the_gate_between_its_two_commits_exits_1(ext_repo, tmp_path: Path, monkeypatch) -> None:
    """`gdnval gate --backend-repo`: the real service (SQLite, local executor) installs each side's
    commit as the jobs' backend source; the wrong commit fails its bounds, eager is unchanged."""
    from click.testing import CliRunner

    from service.cli import main
    from service.executor_choice import close_executors
    from service.settings import Settings
    from tests.support.gate_suite import serve_in_thread

    repo, right, wrong = ext_repo
    monkeypatch.setenv("GDNVAL_SNAPSHOT_CACHE", str(tmp_path / "snapshots"))
    monkeypatch.delenv("GDNVAL_REPO", raising=False)
    out = tmp_path / "gate.json"
    close_executors()
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'svc.db'}", artifacts_dir=tmp_path / "artifacts",
                        executor="local", poll_interval_s=0.5, lease_s=120.0)
    try:
        with serve_in_thread(settings) as url:
            result = CliRunner().invoke(main, [
                "gate", "--head", wrong[:12], "--base", right[:12], "--backend-repo", str(repo),
                "--suite", "gdn-op", "--preset", "quick", "--param", 'backends=["eager","extgdn"]',
                "--param", "baseline=eager", "--param", "timing=false", "--server", url, "--poll", "0.3",
                "--json", str(out),
            ], catch_exceptions=False)
    finally:
        close_executors()
    assert result.exit_code == 1, result.stdout
    data = json.loads(out.read_text())
    verdicts = {c["name"]: c["verdict"] for cmp in data["comparisons"] for c in cmp["cases"]}
    assert verdicts == {
        "T65_stateless_hqk1_hv2_b1_eager": "unchanged", "T65_stateful_hqk1_hv2_b1_eager": "unchanged",
        "T65_stateless_hqk1_hv2_b1_extgdn": "failed", "T65_stateful_hqk1_hv2_b1_extgdn": "failed",
    }, result.stdout
    assert (data["head"], data["base"]) == (wrong, right)  # resolved in the backend's repository
    cases = {c["name"]: c for cmp in data["comparisons"] for c in cmp["cases"]}
    assert all(c["base_status"] == "passed" for c in cases.values()), cases  # the right commit passes
    o_err = {m["metric"]: m for m in cases["T65_stateful_hqk1_hv2_b1_extgdn"]["metrics"]}["o_rel_l2"]
    assert o_err["base"]["max"] < 1e-5 < 5e-3 < o_err["head"]["max"] and o_err["bound_ok"] is False

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from service.persistence.models import JobRow

    engine = create_engine(settings.db_url)
    with Session(engine) as s:
        for side, sha in (("base", right), ("head", wrong)):
            job = s.get(JobRow, data["comparisons"][0][side]["job_id"])
            prov = {b["backend"]: b for b in job.info["backends"]}
            assert (prov["extgdn"]["distribution"], prov["extgdn"]["version"]) == ("ext-gdn", "0.2.0")
            assert prov["extgdn"]["commit"] == sha and prov["eager"]["distribution"] == "gdnval"
    engine.dispose()


def test_cp_layer_quick_runs_ulysses_and_p2p_over_it_on_two_ranks(ext_repo, tmp_path: Path) -> None:
    """cp-layer's quick preset over the right commit on 2 gloo ranks (the local executor installs
    it, the ranks find it by its entry point): Ulysses and P2P over the packed batch (a sequence
    across the rank boundary) equal its own no-CP layer (run on each sequence alone) to 1e-9 in
    fp64; the job records where the backend came from."""
    repo, right, _ = ext_repo
    sink = RecordingSink()
    params = {"candidates": ["ulysses+extgdn", "p2p+extgdn"], "ref_backend": "extgdn", "dtypes": ["float64"],
              "seq_lens": [], "padding_cases": [], "timing": False}
    spec = JobSpec(job_id=2, suite="cp-layer", preset="quick", params=params, world_size=2, deadline_s=300.0,
                   backend_source=f"git+{repo}@{right}")
    outcome = LocalExecutor(cache_dir=tmp_path / "snapshots").run(spec, sink, threading.Event())
    assert outcome.status == "succeeded", (outcome, sink.cases)
    names = {"ulysses_extgdn_T160_B1_packed4", "p2p_extgdn_T160_B1_packed4"}
    assert sink.cases == {n: ("passed", None) for n in names}
    for metric in ("fp64_worst_rel_l2", "cp_worst_rel_l2", "hop_counts_ok"):
        got = {(s.case, s.rank): s.value for s in sink.samples_ if s.metric == metric}
        assert set(got) == {(n, r) for n in names for r in (0, 1)}, got
        assert all(v == 1.0 for v in got.values()) if metric == "hop_counts_ok" else max(got.values()) <= 1e-9
    prov = {b["backend"]: b for info in sink.infos for b in info.get("backends", [])}
    assert (prov["extgdn"]["distribution"], prov["extgdn"]["commit"]) == ("ext-gdn", right)


def test_sources_that_cannot_be_had_are_refused(ext_repo, tmp_path: Path) -> None:
    repo, _, _ = ext_repo
    with pytest.raises(BackendSourceError, match=r"expected 'git\+<repository>@<commit>'"):
        BackendSource.parse("git+nowhere")
    with pytest.raises(BackendSourceError, match=r"neither 'git\+<repository>@<commit>' nor a pip req"):
        BackendSource.parse("not a requirement !")
    assert BackendSource.parse("fla-core==0.6.0").requirement == "fla-core==0.6.0"
    with pytest.raises(BackendSourceError, match=r"backend source git\+.*@0{40}: git rev-parse"):
        install_backend_source(f"git+{repo}@{'0' * 40}", tmp_path)
    sink = _job(tmp_path, f"git+{tmp_path / 'no-repo'}@main", {"backends": ["eager"]})
    assert sink.outcome.status == "failed"  # type: ignore[attr-defined]
    assert "cannot install the backend source" in sink.outcome.error  # type: ignore[attr-defined]
    assert not sink.cases  # nothing ran without the code it names


def test_a_job_request_names_its_backend_source_in_a_label() -> None:
    from service.domain.submission import InvalidJob, validate_request

    body = {"suite": "gdn-op", "preset": "quick", "params": {"backends": ["eager", "extgdn"]},
            "labels": {"backend_source": "git+../ext-gdn@v1"}}
    assert validate_request(body, None).labels["backend_source"].endswith("@v1")
    with pytest.raises(InvalidJob, match=r"label 'backend_source': backend source 'git\+x'"):
        validate_request({**body, "labels": {"backend_source": "git+x"}}, None)


def test_run_and_backends_take_the_source_and_resolve_it_before_any_rank(
    ext_repo, tmp_path: Path, monkeypatch
) -> None:
    """`gdnval run --backend-source` installs the source as a job's label would and runs it;
    without it the backend does not resolve and the run stops at once (one line, exit 2);
    `gdnval backends --backend-source` lists it as an entry point with its commit and capability."""
    import os
    import sys

    repo, right, _ = ext_repo
    monkeypatch.setenv("GDNVAL_SNAPSHOT_CACHE", str(tmp_path / "snapshots"))
    source = f"git+{repo}@{right}"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                              env=dict(os.environ), timeout=600)

    run = ("run", "gdn-op", "--param", 'backends=["eager","extgdn"]', "--param", "timing=false")
    missing = cli(*run, "--dry-run")
    assert missing.returncode == 2 and "backend='extgdn' is not supported" in missing.stderr, missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    out = tmp_path / "run.json"
    done = cli(*run, "--backend-source", source, "--json", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "passed" and any(c["name"].endswith("_extgdn") for c in doc["cases"])
    prov = {b["backend"]: b for b in doc["info"]["backends"]}
    assert (prov["extgdn"]["distribution"], prov["extgdn"]["commit"]) == ("ext-gdn", right)

    listed = cli("backends", "--backend-source", source, "--seq-len", "65", "--dtype", "float32")
    assert listed.returncode == 0, listed.stderr
    row = next(line.split("\t") for line in listed.stdout.splitlines() if line.startswith("extgdn\t"))
    assert row[1] == f"entry point: ext-gdn 0.2.0 @ {right[:12]}", row
    assert row[2] == "declares: ok; a 64-token call: ok", row
