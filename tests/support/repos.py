"""The project's runtime code copied into a temporary git repository, for the tests whose jobs
run a commit's snapshot (the executor imports the snapshot's packages, not this checkout's)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.paths import ROOT

RUNTIME_PACKAGES = ("gdn", "kernels", "workers")  # what a rank imports


def copy_runtime(dest: Path, helper: Path) -> Path:
    """Copy the runtime packages and the test helper module `helper` (a file of tests/support)
    into `dest`, the helper at the same path so the snapshot imports it under the same name.
    Returns the helper's copy, for the test to rewrite between commits."""
    if helper.parent != ROOT / "tests" / "support":
        raise ValueError(f"helper {helper} is not a module of {ROOT / 'tests' / 'support'}")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in RUNTIME_PACKAGES:
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=ignore)
    support = dest / "tests" / "support"
    support.mkdir(parents=True)
    (dest / "tests" / "__init__.py").write_text("")
    (support / "__init__.py").write_text("")
    copy = support / helper.name
    shutil.copyfile(helper, copy)
    return copy
