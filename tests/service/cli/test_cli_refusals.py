"""Early, clear refusals of the CLI: a gate on a bad ref, an option-like ref, an unknown commit
or an unreadable repository, or on a commit against itself without --fresh, exits 2 with one
line before any service is asked; `gdnval run` refuses a backend that does not resolve here and
a preset none of whose cases runs at the world size; `gdnval backends` lists what resolves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.cli import gdnval, one_line_error
from tests.support.gate_suite import git
from tests.support.ports import free_port


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("refs")
    git(path, "init", "-q")
    for i in range(2):
        (path / "f.txt").write_text(f"{i}\n")
        git(path, "add", "-A")
        git(path, "commit", "-qm", f"c{i}")
    return path


def _gate(repo: Path | str, *args: str) -> subprocess.CompletedProcess:
    down = f"http://127.0.0.1:{free_port()}"  # never reached by a refused gate
    return gdnval("gate", *args, "--repo", str(repo), "--server", down)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--head", "   ", "--base", "HEAD"), "--head: revision must be"),
        (("--head", "--upload-pack=x", "--base", "HEAD"), "got '--upload-pack=x'"),
        (("--head", "HEAD", "--base", "0123456789abcdef"), "--base '0123456789abcdef' is not a commit"),
        (("--head", "HEAD", "--base", "HEAD"), "--base is --head"),
        (("--head", "HEAD~1", "--base", "HEAD^"), "add --fresh"),
    ],
)
def test_a_gate_that_cannot_be_asked_for_is_one_line_and_exit_2(
    repo: Path, args: tuple[str, ...], needle: str
) -> None:
    one_line_error(_gate(repo, *args), needle)


def test_an_unreadable_repository_is_one_line_and_exit_2(tmp_path: Path) -> None:
    one_line_error(_gate(tmp_path, "--head", "HEAD"), f"cannot read the git repository '{tmp_path}'")
    one_line_error(_gate(tmp_path / "absent", "--head", "HEAD"), "cannot read the git repository")


def test_a_commit_against_itself_with_fresh_goes_to_the_service(repo: Path) -> None:
    r = _gate(repo, "--head", "HEAD", "--base", "HEAD", "--fresh")
    assert r.returncode == 2 and "is unreachable" in r.stdout, (r.stdout, r.stderr)


def test_the_gate_request_itself_refuses_base_equal_head_unless_fresh() -> None:
    from service.domain.gate import GateRequest

    sha = "a" * 40
    with pytest.raises(ValueError, match="base is head"):
        GateRequest(head=sha, base=sha)
    assert GateRequest(head=sha, base=sha, reuse=False).base == sha


def test_run_refuses_a_backend_that_does_not_resolve_here() -> None:
    r = gdnval("run", "gdn-op", "--dry-run", "--param", 'backends=["eager","mykernel"]')
    one_line_error(r, "backend='mykernel' is not supported", "registered backends: 'eager'")
    r = gdnval("run", "gdn-op", "--dry-run", "--param", 'backends=["eager","nomod:fn"]')
    one_line_error(r, "module 'nomod' does not import")
    r = gdnval("run", "gdn-op", "--dry-run", "--backend-source", "git+/nonexistent/repo@abc")
    one_line_error(r, "cannot fetch backend repository '/nonexistent/repo'")


def test_run_refuses_a_preset_none_of_whose_cases_runs_and_lists_skips() -> None:
    r = gdnval("run", "network", "--dry-run")
    assert r.returncode == 2 and "none of its 13 case(s) can run at world size 1" in r.stderr, r.stderr
    ok = gdnval("run", "profile", "--preset", "gate-cpu", "--dry-run")
    assert ok.returncode == 0, ok.stderr
    assert "  trace/none\n" in ok.stdout
    assert "trace/p2p (skipped: CP mode 'p2p' needs a job with world size >= 2 (got 1))" in ok.stdout


def test_backends_lists_the_built_ins_and_their_capability_for_a_shape(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # Triton then refuses CPU tensors, naming why
    r = gdnval("backends", "--seq-len", "100", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in r.stdout.splitlines() if "\t" in line}
    assert rows["eager"][0].startswith("built-in: gdnval")
    assert rows["eager"][1] == "declares: ok; a 64-token call: ok"  # it said so, and a call did it
    assert rows["triton"][1].startswith("declares: refuses (")  # triton on CPU tensors: its own reason
    assert "TRITON_INTERPRET=1" in rows["triton"][1]
    assert "B=1 T=100 heads=16/16 head_dim=128 float32 on cpu" in r.stdout
    one_line_error(gdnval("backends", "--backend", "nomod:fn"), "['nomod:fn'] do not resolve here")
    liar = "tests.support.refusing_backend:always_raises"
    r = gdnval("backends", "--backend", liar, "--seq-len", "100", "--dtype", "float32")
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in r.stdout.splitlines() if "\t" in line}
    assert r.returncode == 1, r.stdout + r.stderr  # accepts the shape, fails the call: not "ok"
    assert rows[liar][1] == ("declares: ok; a 64-token call: raised RuntimeError: illegal memory access in "
                             "the fused kernel"), rows[liar]
    assert f"['{liar}'] accept the shape but their call fails" in r.stderr
