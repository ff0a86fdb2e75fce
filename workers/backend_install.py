"""Installing a backend's package into a folder of its own, the way its own build declares.

- **Build isolation** always: the package is built in a fresh environment holding exactly the
  build requirements its `pyproject.toml` names (hatchling, scikit-build-core, setuptools, any
  version), never with whatever the job's environment happens to have.
- **uv** when it is present (next to the job's interpreter or on PATH; `GDNVAL_BACKEND_INSTALLER`
  = `uv` or `pip` forces one): its cached, parallel resolver installs a one-file package several
  times faster than pip (docs/benchmarks.md).
- **Dependencies honoured.** The package goes in without its dependencies; then every requirement
  its metadata declares (markers evaluated by the job's interpreter) is checked against the job's
  environment and the folder. One the environment satisfies is left to it (a backend's `torch`
  is the job's torch, never a second copy); one that is missing is installed into the folder,
  round by round with its own requirements; one the environment has at a version the package
  does not accept is refused, naming the requirement and the version found, as is a missing one
  that cannot be installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

from workers.job_env import CommandCancelled, JobUser, run_job_command

INSTALLER_ENV = "GDNVAL_BACKEND_INSTALLER"  # auto (default) | uv | pip
INSTALL_TIMEOUT_S = 600
MAX_DEPENDENCY_ROUNDS = 8


class InstallError(RuntimeError):
    """The package cannot be built or installed, or its dependencies cannot be met; says why."""


def find_uv(python: str) -> str | None:
    """The uv binary to install with: next to `python` (a venv's), else on PATH; None without one."""
    sibling = Path(python).parent / "uv"
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("uv")


def installer(python: str) -> str:
    """`uv` or `pip`: the one `GDNVAL_BACKEND_INSTALLER` names, else uv where present."""
    choice = os.environ.get(INSTALLER_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "uv", "pip"):
        raise InstallError(f"{INSTALLER_ENV}={choice!r}; expected 'auto', 'uv' or 'pip'")
    if choice == "uv" and find_uv(python) is None:
        raise InstallError(f"{INSTALLER_ENV}=uv but no uv next to {python} or on PATH")
    if choice == "auto":
        return "uv" if find_uv(python) else "pip"
    return choice


def _command(python: str, target: Path, what: list[str]) -> list[str]:
    if installer(python) == "uv":
        uv = find_uv(python)
        assert uv is not None
        return [uv, "pip", "install", "--quiet", "--python", python, "--no-deps",
                "--target", str(target), *what]
    return [python, "-m", "pip", "install", "--no-deps", "--no-input", "--disable-pip-version-check",
            "--target", str(target), *what]


def _run_install(python: str, target: Path, what: list[str], cancel: threading.Event | None,
                 user: JobUser | None) -> None:
    cmd = _command(python, target, what)
    try:
        out = run_job_command(cmd, timeout=INSTALL_TIMEOUT_S, cancel=cancel, install=True, user=user,
                              extra_env=_home(target, user))
    except (OSError, subprocess.TimeoutExpired, CommandCancelled) as exc:
        raise InstallError(f"{Path(cmd[0]).name} install of {' '.join(what)} failed: {exc}") from exc
    if out.returncode != 0:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-12:])
        tool = Path(cmd[0]).name
        raise InstallError(f"{tool} install of {' '.join(what)} failed (exit {out.returncode}):\n{tail}")


# Run by the job's interpreter: every requirement of the distributions in the folder, with what
# the folder or the environment holds of it. Prints JSON: [[requirement, dist, found version or
# null, satisfied, in the folder], ...]
_CHECK = r"""
import json, sys
from importlib import metadata
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
folder = sys.argv[1]
sys.path.insert(0, folder)
own = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions(path=[folder])}
out = []
for dist in own.values():
    for text in dist.requires or ():
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        try:
            found = own[name].version if name in own else metadata.version(req.name)
        except metadata.PackageNotFoundError:
            found = None
        ok = found is not None and req.specifier.contains(found, prereleases=True)
        out.append([str(req), dist.metadata["Name"], found, ok, name in own])
print(json.dumps(out))
"""


def _requirements(python: str, target: Path, cancel: threading.Event | None,
                  user: JobUser | None) -> list[tuple[str, str, str | None, bool, bool]]:
    try:
        out = run_job_command([python, "-c", _CHECK, str(target)], timeout=120, cancel=cancel, install=True,
                              user=user, extra_env=_home(target, user))
    except (OSError, subprocess.TimeoutExpired, CommandCancelled) as exc:
        raise InstallError(f"cannot read the requirements of the packages in {target}: {exc}") from exc
    if out.returncode != 0:
        why = out.stderr.strip()[-800:]
        raise InstallError(f"cannot read the requirements of the packages in {target}: {why}")
    return [tuple(row) for row in json.loads(out.stdout)]  # type: ignore[misc]


def _home(target: Path, user: JobUser | None) -> dict[str, str]:
    """HOME for an installer run as `user`: its own where it can write, else the folder beside
    `target` that was handed to it (the installers keep their caches there)."""
    return {} if user is None else {"HOME": user.home_or(target.parent)}


def install_package(target: Path, what: str, python: str, cancel: threading.Event | None = None,
                    user: JobUser | None = None) -> None:
    """Build `what` (a source folder or a requirement) in isolation and install it into `target`,
    then meet its declared dependencies (see the module docstring), as `user` when given (the
    folder holding `target` is its); raises InstallError, also when `cancel` is set meanwhile
    (the installer's whole process group is killed)."""
    _run_install(python, target, [what], cancel, user)
    tried: set[str] = set()
    for _ in range(MAX_DEPENDENCY_ROUNDS):
        rows = _requirements(python, target, cancel, user)
        conflicts = [f"{req} (required by {dist}; the environment has {found})"
                     for req, dist, found, ok, in_folder in rows if found is not None and not ok]
        if conflicts:
            raise InstallError(f"{what}: requirement(s) the job's environment holds at another version: "
                               f"{'; '.join(conflicts)}")
        missing = sorted({req for req, _, found, _, _ in rows if found is None})
        if not missing:
            return
        again = sorted(set(missing) & tried)
        if again:
            raise InstallError(f"{what}: dependencies still missing after installing them: {again}")
        tried |= set(missing)
        try:
            _run_install(python, target, missing, cancel, user)
        except InstallError as exc:
            raise InstallError(f"{what}: missing dependencies {missing} cannot be installed: {exc}") from exc
    raise InstallError(f"{what}: dependencies not met after {MAX_DEPENDENCY_ROUNDS} rounds of installs")
