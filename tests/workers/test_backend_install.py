"""Backend sources install the way their own builds declare (workers.backend_install): a
hatchling package and a compiled scikit-build-core package (a C extension built by CMake), each
from a commit of a git repository made here, built in isolation; the declared dependencies are
left to the job's environment when it has them, installed beside the package when it does not,
and refused with their names when they conflict or cannot be had; uv installs where present,
pip when told, with the same result. Needs the package index (build requirements are fetched
into the isolated build environments)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.backend_install import INSTALLER_ENV, find_uv, installer
from workers.backend_source import BackendSourceError, install_backend_source

pytestmark = pytest.mark.slow

HATCH = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "hatch-gdn"
version = "0.1.0"
dependencies = [{deps}]

[project.entry-points."gdnval.backends"]
hatchgdn = "hatchgdn:core"

[tool.hatch.build.targets.wheel]
packages = ["hatchgdn"]
"""
SKBUILD = """[build-system]
requires = ["scikit-build-core"]
build-backend = "scikit_build_core.build"

[project]
name = "skb-gdn"
version = "0.1.0"

[project.entry-points."gdnval.backends"]
skbgdn = "skbgdn:core"

[tool.scikit-build]
wheel.packages = ["src/skbgdn"]
"""
CMAKE = """cmake_minimum_required(VERSION 3.15)
project(${SKBUILD_PROJECT_NAME} LANGUAGES C)
find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)
python_add_library(_native MODULE src/native.c WITH_SOABI)
install(TARGETS _native DESTINATION skbgdn)
"""
NATIVE_C = """#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *args) {
    double x;
    if (!PyArg_ParseTuple(args, "d", &x)) return NULL;
    return PyFloat_FromDouble(2.0 * x);
}
static PyMethodDef methods[] = {{"twice", twice, METH_VARARGS, "2x"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};
PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&mod); }
"""


def _commit(repo: Path, files: dict[str, str]) -> str:
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        subprocess.run([*git, "init", "-q"], check=True)
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _hatch(repo: Path, deps: list[str]) -> str:
    core = "def core(*args, **kwargs):\n    raise NotImplementedError\n"
    pyproject = HATCH.format(deps=", ".join(f'"{d}"' for d in deps))
    return _commit(repo, {"pyproject.toml": pyproject, "hatchgdn/__init__.py": core})


def _imports(site: Path, code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=site.parent,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, check=True)
    return out.stdout.strip()


def test_a_hatchling_package_installs_in_isolation_its_missing_dependency_beside_it(tmp_path: Path) -> None:
    repo = tmp_path / "hatch"
    sha = _hatch(repo, ["numpy>=1.20", "tomli-w>=1.0"])  # numpy: the job's; tomli-w: not installed here
    site = install_backend_source(f"git+{repo}@{sha}", tmp_path / "cache")
    names = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert names == {"hatch_gdn", "tomli_w"}, names  # numpy left to the environment, never copied
    assert _imports(site, "import hatchgdn, tomli_w; print(tomli_w.dumps({'a': 1}).strip())") == "a = 1"


def test_a_compiled_scikit_build_core_package_installs(tmp_path: Path) -> None:
    repo = tmp_path / "skb"
    init = "from skbgdn._native import twice\n\n\ndef core(*a, **k):\n    raise NotImplementedError\n"
    files = {"pyproject.toml": SKBUILD, "CMakeLists.txt": CMAKE, "src/native.c": NATIVE_C,
             "src/skbgdn/__init__.py": init}
    sha = _commit(repo, files)
    site = install_backend_source(f"git+{repo}@{sha}", tmp_path / "cache")
    assert list((site / "skbgdn").glob("_native*.so")), list(site.rglob("*"))
    assert _imports(site, "import skbgdn; print(skbgdn.twice(2.5))") == "5.0"


def test_dependencies_that_conflict_or_cannot_be_had_are_refused_by_name(tmp_path: Path) -> None:
    import numpy

    repo = tmp_path / "hatch"
    old = _hatch(repo, ["numpy<1"])
    with pytest.raises(
        BackendSourceError,
        match=rf"numpy<1 \(required by hatch-gdn; the environment has {numpy.__version__}\)",
    ):
        install_backend_source(f"git+{repo}@{old}", tmp_path / "cache")
    nowhere = _hatch(repo, ["gdnval-no-such-distribution-anywhere>=1"])
    with pytest.raises(
        BackendSourceError, match=r"missing dependencies \['gdnval-no-such-distribution-anywhere>=1'\]"
    ):
        install_backend_source(f"git+{repo}@{nowhere}", tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("git-*"))  # nothing half-installed is left to be used


def test_installers_uv_where_present_and_pip_when_told_agree(tmp_path: Path, monkeypatch) -> None:
    """One-file package (no dependencies), a fresh cache each time: the install's wall time with
    each installer (docs/benchmarks.md quotes this test's output)."""
    assert find_uv(sys.executable) is not None, "uv (the dev extra) is not installed next to python"
    repo = tmp_path / "one"
    sha = _hatch(repo, [])
    seconds = {}
    for tool in ("uv", "pip"):
        monkeypatch.setenv(INSTALLER_ENV, tool)
        assert installer(sys.executable) == tool
        t0 = time.perf_counter()
        site = install_backend_source(f"git+{repo}@{sha}", tmp_path / f"cache-{tool}")
        seconds[tool] = time.perf_counter() - t0
        assert _imports(site, "import hatchgdn; print(hatchgdn.core.__name__)") == "core"
    monkeypatch.setenv(INSTALLER_ENV, "auto")
    assert installer(sys.executable) == "uv"
    monkeypatch.setenv(INSTALLER_ENV, "conda")
    with pytest.raises(Exception, match=r"GDNVAL_BACKEND_INSTALLER='conda'; expected 'auto', 'uv' or 'pip'"):
        installer(sys.executable)
    uv, pip = seconds["uv"], seconds["pip"]
    print(f"backend install of a one-file hatchling package: uv {uv:.1f} s, pip {pip:.1f} s")
