"""A gate on a backend's own repository: which suites it runs, with which parameters, what it
refuses before anything is queued, and how the CLI names the backend from the package."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from service.domain.gate import GateInputError, GateRequest, params_for, suites_for, validate_gate
from workers.backend_source import entry_point_names
from workers.registry import get_suite

C1, C2 = "1" * 40, "2" * 40
REPO = "/srv/repos/mykernel"


def backend_gate(**kw: object) -> GateRequest:
    return GateRequest(head=C2, base=C1, backend_repo=REPO, backend="mykernel", **kw)  # type: ignore[arg-type]


def test_the_default_suites_are_those_that_call_the_backend_each_calling_it() -> None:
    one = backend_gate()
    assert validate_gate(one) == ["gdn-op", "capability", "cp-layer"]
    gdn_op = params_for(one, "gdn-op")
    assert gdn_op["backends"] == gdn_op["timed_backends"] == ["eager", "mykernel"]  # timed beside eager
    assert gdn_op["baseline"] == "eager"
    assert params_for(one, "capability")["backends"] == ["eager", "mykernel"]
    assert params_for(one, "cp-layer")["candidates"] == ["p2p_emulated+mykernel"]  # one rank: emulated
    two = backend_gate(world_size=2)
    assert params_for(two, "cp-layer")["candidates"] == ["ulysses+mykernel", "p2p+mykernel"]
    for suite in validate_gate(one):
        preset = get_suite(suite).gate_presets["cpu"]
        resolved = get_suite(suite).resolve_params(preset, params_for(one, suite), "cpu")
        assert "mykernel" in get_suite(suite).backends(resolved), suite
    # request parameters apply on top of the backend's
    assert params_for(backend_gate(params={"seq_lens": [64]}), "gdn-op")["seq_lens"] == [64]
    # without a backend the gate's parameters are the request's alone
    assert params_for(GateRequest(head=C2, base=C1, params={"timing": False}), "gdn-op") == {"timing": False}
    assert "stability" not in suites_for(backend_gate(world_size=2))


def test_a_gate_whose_jobs_never_call_the_backend_is_refused() -> None:
    never = r"'gdn-op' .* would never call backend 'mykernel' \(its jobs call \['eager'\]\)"
    with pytest.raises(GateInputError, match=never):
        validate_gate(backend_gate(suites=["gdn-op"], params={"backends": ["eager"]}))
    untimed = r"times only \['eager'\]; a slower 'mykernel' would pass unseen"
    with pytest.raises(GateInputError, match=untimed):
        validate_gate(backend_gate(suites=["gdn-op"], params={"timed_backends": ["eager"]}))
    with pytest.raises(GateInputError, match=r"'network' .* would never call backend 'mykernel'"):
        validate_gate(backend_gate(suites=["network"]))
    assert validate_gate(backend_gate(suites=["gdn-op"], params={"timing": False})) == ["gdn-op"]
    with pytest.raises(ValueError, match=r"backend_repo '/srv/repos/mykernel' needs backend"):
        GateRequest(head=C2, base=C1, backend_repo=REPO)


def _package(repo: Path, entry_points: dict[str, str]) -> str:
    repo.mkdir()
    eps = "".join(f'{k} = "{v}"\n' for k, v in entry_points.items())
    (repo / "pyproject.toml").write_text(
        '[project]\nname = "k"\nversion = "1"\n\n[project.entry-points."gdnval.backends"]\n' + eps
    )
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c1"], check=True)
    out = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def test_the_cli_names_the_backend_from_the_package_or_refuses_with_the_names(tmp_path: Path) -> None:
    from service.cli import main

    one, two = tmp_path / "one", tmp_path / "two"
    assert entry_point_names(one, _package(one, {"mykernel": "mk:core"})) == ["mykernel"]
    sha = _package(two, {"fast": "mk:fast", "slow": "mk:slow"})
    assert entry_point_names(two, sha) == ["fast", "slow"]
    assert entry_point_names(two, "HEAD:nothing") == []
    result = CliRunner().invoke(main, ["gate", "--backend-repo", str(two), "--head", "HEAD", "--base", "HEAD",
                                       "--fresh", "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "declares the entry points ['fast', 'slow']; name one with --backend" in result.stderr
    result = CliRunner().invoke(main, ["gate", "--backend", "fast", "--head", "HEAD", "--base", "HEAD",
                                       "--fresh", "--repo", str(two),
                                       "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "--backend 'fast' names the backend of --backend-repo" in result.stderr
