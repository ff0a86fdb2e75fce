"""A backend from someone else's repository, end to end on the CPU: a small package written here
(a plain-torch per-token recurrence, autograd for the backward) in a git repository with two
commits, the second numerically wrong; installed per commit into a folder of its own
(workers.backend_source), found through its `gdnval.backends` entry point, and run by gdn-op's
quick preset beside `eager` through the real local executor."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from tests.suites_for_tests import RecordingSink
from workers.backend_source import BackendSource, BackendSourceError, install_backend_source
from workers.executor import JobSpec
from workers.executors.local import LocalExecutor
from workers.provenance import BACKEND_COMMIT_FILE

pytestmark = pytest.mark.slow

CORE = '''"""A per-token gated delta rule in plain torch; autograd gives the backward."""
import torch


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
    qh = q.to(dt).repeat_interleave(hv // hq, dim=2)
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
PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "ext-gdn"
version = "0.2.0"

[project.entry-points."gdnval.backends"]
extgdn = "extgdn:core"
"""


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                         check=True, capture_output=True, text=True)  # fmt: skip
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
    sink = RecordingSink()
    spec = JobSpec(job_id=1, suite="gdn-op", preset="quick", params=params, deadline_s=300.0,
                   backend_source=source)  # fmt: skip
    outcome = LocalExecutor(cache_dir=cache / "snapshots").run(spec, sink, threading.Event())
    sink.outcome = outcome  # type: ignore[attr-defined]
    return sink


def _provenance(sink: RecordingSink, name: str) -> dict:
    found = [b for info in sink.infos for b in info.get("backends", []) if b["backend"] == name]
    assert found, sink.infos
    return found[0]


def test_each_commit_installs_once_and_runs_beside_eager(ext_repo, tmp_path: Path) -> None:
    repo, right, wrong = ext_repo
    site = install_backend_source(f"git+{repo}@{right[:10]}", tmp_path / "backends")
    assert (site / BACKEND_COMMIT_FILE).read_text().strip() == right
    stamp = (site / BACKEND_COMMIT_FILE).stat().st_mtime_ns
    assert install_backend_source(f"git+{repo}@{right}", tmp_path / "backends") == site  # cached
    assert (site / BACKEND_COMMIT_FILE).stat().st_mtime_ns == stamp

    good = _job(tmp_path, f"git+{repo}@{right}", {"backends": ["eager", "extgdn"]})
    assert good.outcome.status == "succeeded", good.outcome.error  # type: ignore[attr-defined]
    assert {n: s for n, (s, _) in good.cases.items()} == {
        f"T65_{m}_hqk1_hv2_b1_{b}": "passed" for m in ("stateless", "stateful") for b in ("eager", "extgdn")
    }
    worst = max(v for t in ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
                for v in good.values("T65_stateful_hqk1_hv2_b1_extgdn", f"{t}_rel_l2")[0])  # fmt: skip
    assert worst < 1e-5  # fp32 per-token recurrence against the fp64 oracle
    assert good.values("T65_stateful_hqk1_hv2_b1_eager", "fwd_ms")[0]  # eager timed beside it
    prov = _provenance(good, "extgdn")
    assert (prov["distribution"], prov["version"], prov["commit"]) == ("ext-gdn", "0.2.0", right)

    bad = _job(tmp_path, f"git+{repo}@{wrong}",
               {"backends": ["extgdn"], "baseline": "extgdn", "modes": ["stateful"], "timing": False})
    status, why = bad.cases["T65_stateful_hqk1_hv2_b1_extgdn"]
    assert status == "failed" and "rel_l2" in (why or ""), (status, why)
    assert min(bad.values("T65_stateful_hqk1_hv2_b1_extgdn", "o_rel_l2")[0]) > 5e-3
    assert _provenance(bad, "extgdn")["commit"] == wrong


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
    from service.queue import InvalidJob, validate_request

    body = {"suite": "gdn-op", "preset": "quick", "params": {"backends": ["eager", "extgdn"]},
            "labels": {"backend_source": "git+https://example.invalid/ext-gdn.git@v1"}}  # fmt: skip
    assert validate_request(body, None).labels["backend_source"].endswith("@v1")
    with pytest.raises(InvalidJob, match=r"label 'backend_source': backend source 'git\+x'"):
        validate_request({**body, "labels": {"backend_source": "git+x"}}, None)
