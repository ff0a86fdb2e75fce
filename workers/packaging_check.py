"""Delivery check: the built wheel, installed into an isolated environment, carries the kernels.

The report shipped a wheel and checked it in a clean environment (the capability suite's wheel case): a wheel
that forgets `kernels/` imports fine on CPU and fails only when the Triton backend is first asked
for on a GPU. `check_wheel` builds the wheel from a copy of the source (the tree itself is never
written to), lists what it contains, installs it into a fresh venv without pip and without the
source tree on the path, and imports `gdn` there. The venv borrows the running environment's
third-party packages (torch, ...) through a `.pth` line, which does not activate this
environment's own editable install, so the `gdn` it imports is the wheel's.

Used by the `capability` suite (gate/full presets) and by the foundation's tests.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("gdn", "kernels", "workers", "service", "migrations")
TOP_FILES = ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "MANIFEST.in")
REQUIRED_KERNEL_FILES = ("kernels/__init__.py", "kernels/gdn/__init__.py", "kernels/gdn/function.py")

_PROBE = """
import json, sys
import gdn
loaded_after_gdn = sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'kernels'))
import kernels
print(json.dumps({"gdn": gdn.__file__, "kernels": kernels.__file__, "loaded_after_gdn": loaded_after_gdn}))
"""


@dataclass
class WheelCheck:
    """What the wheel holds and what importing it in the isolated venv did."""

    wheel: Path | None = None
    kernel_files: list[str] = field(default_factory=list)
    gdn_file: str | None = None
    kernels_file: str | None = None
    loaded_after_import_gdn: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _run(cmd: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def copy_source(source_root: Path, dest: Path) -> Path:
    """Copy what the wheel is built from, without caches, build output or egg-info."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist", ".pytest_cache")
    dest.mkdir(parents=True, exist_ok=True)
    for name in TOP_FILES:
        if (source_root / name).is_file():
            shutil.copy2(source_root / name, dest / name)
    for pkg in PACKAGES:
        if (source_root / pkg).is_dir():
            shutil.copytree(source_root / pkg, dest / pkg, ignore=ignore)
    return dest


def build_wheel(
    source_root: Path, workdir: Path, *, python: str = sys.executable, timeout: float = 600
) -> Path:
    """Build the project's wheel from a copy of `source_root`; returns the .whl path."""
    src = copy_source(source_root, workdir / "src")
    dist = workdir / "dist"
    out = _run(
        [python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(dist), str(src)],
        timeout,
    )
    wheels = sorted(dist.glob("gdnval-*.whl"))
    if out.returncode != 0 or not wheels:
        detail = _tail(out.stderr or out.stdout)
        raise RuntimeError(f"building the wheel from {source_root} failed:\n{detail}")
    return wheels[-1]


def check_wheel(
    source_root: str | Path, workdir: str | Path, *, python: str = sys.executable, timeout: float = 600
) -> WheelCheck:
    """Build, inspect, install in an isolated venv, import. Never raises for a bad wheel: see `problems`."""
    source_root, workdir = Path(source_root), Path(workdir)
    result = WheelCheck()
    try:
        result.wheel = build_wheel(source_root, workdir, python=python, timeout=timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        result.problems.append(str(exc))
        return result
    with zipfile.ZipFile(result.wheel) as zf:
        names = zf.namelist()
    result.kernel_files = sorted(n for n in names if n.startswith("kernels/") and n.endswith(".py"))
    missing = [f for f in REQUIRED_KERNEL_FILES if f not in names]
    if missing or len(result.kernel_files) < 2:
        result.problems.append(
            f"wheel {result.wheel.name} lacks kernel modules: has {result.kernel_files}, "
            f"expected {list(REQUIRED_KERNEL_FILES)} and at least one kernel module"
        )
    venv = workdir / "venv"
    out = _run([python, "-m", "venv", "--without-pip", str(venv)], timeout)
    if out.returncode != 0:
        result.problems.append(f"creating the venv failed: {_tail(out.stderr)}")
        return result
    vpy = venv / "bin" / "python"
    out = _run(
        [python, "-m", "pip", "--python", str(vpy), "install", "--no-deps", "--no-index", "-q",
         str(result.wheel)],
        timeout,
    )
    if out.returncode != 0:
        result.problems.append(f"installing {result.wheel.name} into the venv failed: {_tail(out.stderr)}")
        return result
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = _run([str(vpy), "-c", where], 60).stdout.strip()
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "_gdnval_borrowed_deps.pth").write_text("\n".join(deps) + "\n")
    out = _run([str(vpy), "-I", "-c", _PROBE], timeout, cwd=workdir)
    if out.returncode != 0:
        result.problems.append(f"importing gdn from the installed wheel failed:\n{_tail(out.stderr)}")
        return result
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    result.gdn_file, result.kernels_file = probe["gdn"], probe["kernels"]
    result.loaded_after_import_gdn = probe["loaded_after_gdn"]
    for name, path in (("gdn", result.gdn_file), ("kernels", result.kernels_file)):
        if not str(path).startswith(str(Path(site))):
            result.problems.append(f"{name} imported from {path}, not from the venv's {site}")
    if result.loaded_after_import_gdn:
        result.problems.append(f"import gdn loaded {result.loaded_after_import_gdn} from the wheel")
    return result
