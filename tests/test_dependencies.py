"""What gdnval imports is what it declares: every third-party module of its packages belongs to a
distribution pyproject.toml names (the base or an extra), the base install is the service without
torch, and that install, made in a fresh virtual environment, imports and serves."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "workers", "gdn", "kernels", "migrations")
# optional backends' modules that no environment here installs: their distributions, by hand
NOT_INSTALLED_HERE = {"fla": "flash-linear-attention", "flash_qla": "flash-qla"}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def imported_modules() -> dict[str, str]:
    """Top-level module -> one file importing it, over the project's packages (stdlib and the
    project's own packages aside)."""
    out: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found = [node.module]
                else:
                    continue
                for name in found:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        out.setdefault(top, str(path.relative_to(ROOT)))
    return out


def test_every_imported_module_is_declared() -> None:
    meta = project()
    declared = names(meta["dependencies"]) | {n for extra in meta["optional-dependencies"].values()
                                              for n in names(extra)}
    owners = metadata.packages_distributions()
    missing = []
    for module, where in sorted(imported_modules().items()):
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        if not dists and module in NOT_INSTALLED_HERE:
            dists = {canonicalize_name(NOT_INSTALLED_HERE[module])}
        if not dists & declared:
            missing.append(f"{module} (imported by {where}; distribution {sorted(dists) or 'unknown'})")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)


def test_the_base_install_is_the_service_without_torch() -> None:
    meta = project()
    base = names(meta["dependencies"])
    assert "torch" not in base and "triton" not in base and "ray" not in base
    assert {"starlette", "markupsafe", "packaging"} <= base
    assert names(meta["optional-dependencies"]["torch"]) == {"torch"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_fresh_service_install_imports_and_serves_without_torch(tmp_path: Path) -> None:
    """`pip install .` (the base, as an API/dispatcher container installs it) into a new venv:
    no torch there, the service and every suite's spec import, and `gdnval serve` answers."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run([*pip, str(ROOT)], capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check = """
import importlib.util, json, sys
import service.app, service.cli
from workers.registry import get_suite, suite_names
described = [get_suite(n).describe()["name"] for n in suite_names()]
print(json.dumps({"torch": importlib.util.find_spec("torch") is not None, "suites": described,
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton"))}))
"""
    out = subprocess.run([str(py), "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert got["torch"] is False and got["loaded"] == [] and "cp-layer" in got["suites"]

    port = free_port()
    env = {**os.environ, "GDNVAL_DB_URL": f"sqlite:///{tmp_path / 'store.db'}", "GDNVAL_API_TOKEN": "t",
           "GDNVAL_ARTIFACTS_DIR": str(tmp_path / "artifacts"), "PYTHONPATH": ""}
    serve = [str(venv / "bin" / "gdnval"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(serve, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        import httpx

        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/api/v1/suites", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (
                server.stdout.read().decode()[-3000:] if server.stdout else "no output")
            time.sleep(0.5)
        suites = httpx.get(f"{base}/api/v1/suites", timeout=10).json()["items"]
        assert {"cp-layer", "network", "gdn-op"} <= {s["name"] for s in suites}
        assert not [s for s in suites if s.get("error")], suites  # every spec loads without torch
        for page in ("/jobs", "/suites", "/campaigns"):
            assert httpx.get(base + page, timeout=10).status_code == 200, page
    finally:
        server.terminate()
        server.wait(20)
