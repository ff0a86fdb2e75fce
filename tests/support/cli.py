"""Running `gdnval` in tests as a user runs it: in a process of its own (exit code, stdout and
stderr as a shell sees them) or in this process through click's runner (the real command, its
HTTP going to a real server), and the check of a one-line refusal."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from tests.support.paths import ROOT


def gdnval(*args: str, env: Mapping[str, str] | None = None, unset: tuple[str, ...] = (),
           cwd: Any = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`gdnval ARGS` in a process of this interpreter, the checkout first on its path; `env` is its
    environment (default: this process's) less the variables named in `unset`."""
    full = {k: v for k, v in (os.environ if env is None else env).items() if k not in unset}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


def gdnval_here(*args: str, env: Mapping[str, str] | None = None) -> Any:
    """`gdnval ARGS` in this process; click's result (`exit_code`, `stdout`, `stderr`, `output`).
    An exception the command does not handle fails the test with its traceback."""
    from click.testing import CliRunner

    from service.cli import main

    return CliRunner().invoke(main, list(args), env=dict(env or {}), catch_exceptions=False)


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """The command refused with exit 2 and one `error: ` line on stderr naming every needle, no
    traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
