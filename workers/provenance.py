"""Which code is running: the installed version and the git commit of the source tree."""

from __future__ import annotations

import subprocess
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parent.parent


def installed_version() -> str:
    try:
        return version("gdnval")
    except PackageNotFoundError:
        return "0+unknown"


@cache
def source_commit(root: Path = SOURCE_ROOT) -> str | None:
    """The commit of the source tree the code is imported from, or None outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else None


@cache
def source_modified(root: Path = SOURCE_ROOT) -> bool | None:
    """Whether tracked files differ from `source_commit` (a copied or edited tree), None outside a
    checkout: a result recorded with commit X from a modified tree is not X's result."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None
