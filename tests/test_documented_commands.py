"""Every command shown in README.md, CONTRIBUTING.md and docs/ works as written.

Each documented command is checked where this machine can check it: a `gdnval` command is parsed
by the real CLI exactly as written (a synopsis: each option it names exists), a script's path and
options exist, a device-session step is one the script knows, a pytest path exists, a compose
file and service exist. The commands that run on a CPU in seconds are run here as written; the
long ones are run by the tests of their own feature, and GPU ones on the device.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.support.doc_commands import ROOT, DocCommand, documented_commands, simple_commands

COMMANDS = documented_commands()
GDNVAL = ("gdnval", ".venv/bin/gdnval")
PYTHONS = ("python", "python3", ".venv/bin/python")
SESSION_SCRIPTS = ("benchmarks/kernel_session.sh", "benchmarks/device_session.sh",
                   "benchmarks/multi_gpu_session.sh")


def _ids(cmds: list[DocCommand]) -> list[str]:
    return [f"{c.path}:{c.line}" for c in cmds]


def _options(words: list[str]) -> list[str]:
    """The long options a command names (`--x=1` and `[--x` both name `--x`)."""
    out = []
    for w in words:
        m = re.match(r"^\[?(--[a-z][a-z0-9-]*)", w)
        if m:
            out.append(m.group(1))
    return out


def _gdnval_command(words: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """The click command a `gdnval ...` argv names, its name path and the remaining args."""
    from service.cli import main

    cmd: click.Command = main
    path = ["gdnval"]
    rest = list(words)
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        sub = cmd.get_command(click.Context(cmd), rest[0])
        assert sub is not None, f"`{' '.join(path)}` has no sub-command {rest[0]!r}"
        cmd, path, rest = sub, [*path, rest[0]], rest[1:]
    return cmd, path, rest


def _check_gdnval(words: list[str], strict: bool) -> None:
    cmd, path, rest = _gdnval_command(words)
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
    for opt in _options(rest):
        assert opt in known, f"`{' '.join(path)}` has no option {opt}; it has {sorted(known)}"
    if strict and rest:
        # Parsed exactly as written: types, choices and required values, without running it.
        cmd.make_context(" ".join(path), list(rest), resilient_parsing=False)


def _check_python(words: list[str]) -> None:
    if words[:2] == ["-m", "pytest"]:
        for arg in words[2:]:
            if not arg.startswith("-") and arg.startswith("tests"):
                assert (ROOT / arg.split("::")[0]).exists(), f"no test path {arg}"
        return
    if words[0] == "-m":
        module = words[1]
        base = ROOT / module.replace(".", "/")
        assert base.with_suffix(".py").exists() or (base / "__main__.py").exists(), f"no module {module}"
        source = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__main__.py"
        args = words[2:]
    else:
        source = ROOT / words[0]
        assert source.exists(), f"no script {words[0]}"
        args = words[1:]
    if module_is_cli(words):
        _check_gdnval(args, strict=False)
        return
    text = source.read_text()
    for opt in _options(args):
        assert f'"{opt}"' in text or f"'{opt}'" in text, f"{source.relative_to(ROOT)} has no option {opt}"


def module_is_cli(words: list[str]) -> bool:
    return words[:2] == ["-m", "service.cli"]


def _session_steps(script: Path) -> set[str]:
    """The step kinds of a session script's case labels: `gputest)`, `fla|qla)`,
    `net200:* | netfloor:*)`."""
    labels = re.findall(r"^\s*([a-z][a-z0-9_:*| ]*)\)", script.read_text(), re.M)
    return {k.strip().split(":")[0] for label in labels for k in label.split("|")} - {"*", ""}


def _check_bash(words: list[str]) -> None:
    script = next((w for w in words if w.endswith(".sh")), None)
    if script is None:
        return
    assert (ROOT / script).exists(), f"no script {script}"
    if script in SESSION_SCRIPTS:
        known = _session_steps(ROOT / script)
        for step in words[words.index(script) + 1:]:
            if step.startswith("<") or step.isupper():
                continue
            kind = step.split(":")[0]
            assert kind in known, f"{script} has no step {kind!r}; it has {sorted(known)}"


def _check_docker(words: list[str]) -> None:
    if "-f" not in words:
        return
    compose = ROOT / words[words.index("-f") + 1]
    assert compose.exists(), f"no compose file {compose.relative_to(ROOT)}"
    if "up" in words:
        services = [w for w in words[words.index("up") + 1:] if not w.startswith("-")]
        text = compose.read_text()
        for s in services:
            assert re.search(rf"^  {re.escape(s)}:", text, re.M), f"{compose.name} has no service {s}"


def test_the_docs_show_commands() -> None:
    """The extraction finds the commands of README's two set-up lines and of every how-to."""
    texts = {c.text for c in COMMANDS}
    assert "bash scripts/bootstrap.sh && .venv/bin/gdnval serve --demo" in texts
    assert any(c.path == "docs/howto-backend.md" for c in COMMANDS)
    assert len(COMMANDS) > 50


@pytest.mark.parametrize("cmd", COMMANDS, ids=_ids(COMMANDS))
def test_documented_command_is_valid_as_written(cmd: DocCommand) -> None:
    strict = not cmd.synopsis and cmd.path.endswith(".md") and _fenced(cmd)
    for words in simple_commands(cmd.text):
        head, args = words[0], words[1:]
        if head in GDNVAL:
            _check_gdnval(args, strict)
        elif head in PYTHONS and args:
            _check_python(args)
        elif head == "bash":
            _check_bash(args)
        elif head == "docker":
            _check_docker(args)


def _fenced(cmd: DocCommand) -> bool:
    """Whether the command is a line of a shell block (a command to paste) or an inline mention."""
    lines = (ROOT / cmd.path).read_text().splitlines()
    inside = False
    for no, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            inside = not inside
        if no == cmd.line:
            return inside
    return False


# Commands that finish in seconds on a CPU, run exactly as written (from a scratch directory, so
# files they write stay there). The long ones are run by the tests of their features.
QUICK_TEXTS = {"gdnval db upgrade", "gdnval run network --preset gate --device npu --dry-run"}
QUICK = [c for c in COMMANDS if c.text in QUICK_TEXTS]


@pytest.mark.parametrize("cmd", QUICK, ids=_ids(QUICK))
def test_quick_documented_command_runs(cmd: DocCommand, tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "GDNVAL_DB_URL": f"sqlite:///{tmp_path / 'gdnval.db'}"}
    proc = subprocess.run(cmd.text, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    tail = f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{tail}"


def test_quick_commands_are_documented() -> None:
    missing = QUICK_TEXTS - {c.text for c in QUICK}
    assert not missing, f"commands run here are no longer in the docs: {missing}; update QUICK_TEXTS"
