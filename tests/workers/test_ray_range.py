"""Ray as a range a cluster can meet (the `ray` extra of pyproject.toml), tested at both ends: the
Ray this environment installed lies in the range, and the executor runs real jobs on a local
cluster of the range's lower bound (.venv-ray-lower, made by `bash scripts/bootstrap.sh test`:
this environment's packages with that Ray in front of them)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOWER_VENV = ROOT / ".venv-ray-lower"
# the executor's tests that reach what changes between Ray releases: a job on a ray rank, the
# commit snapshot shipped through the runtime_env upload, placement groups of fake accelerators (two)
AT_THE_BOUND = ("capability_runs_on_a_ray_rank or runs_its_commit_from_the_shipped_runtime_env "
                "or fake_accelerators")


def declared() -> Requirement:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    (req,) = [Requirement(r) for r in extra]
    return req


def lower_bound() -> str:
    found = [s.version for s in declared().specifier if s.operator == ">="]
    assert len(found) == 1, f"the ray extra {declared()} has no single lower bound (>=)"
    return found[0]


def test_the_installed_ray_lies_in_the_declared_range() -> None:
    pytest.importorskip("ray")
    req = declared()
    assert req.name == "ray" and "default" in req.extras
    installed = metadata.version("ray")
    assert req.specifier.contains(installed), f"ray {installed} is outside the declared {req.specifier}"
    (upper,) = [Version(s.version) for s in req.specifier if s.operator == "<"]
    lower = Version(lower_bound())
    assert (upper.major, upper.minor) > (lower.major, lower.minor + 1), f"{req.specifier}: one Ray minor only"


@pytest.mark.slow
def test_the_executor_runs_jobs_at_the_declared_lower_bound() -> None:
    python = LOWER_VENV / "bin" / "python"
    if not python.exists():
        skip = ROOT / ".venv-ray-lower.skip"
        pytest.skip(skip.read_text().strip() if skip.exists() else "no .venv-ray-lower (bootstrap.sh test)")
    version = subprocess.run([str(python), "-c", "import ray; print(ray.__version__)"], capture_output=True,
                             text=True, timeout=120, check=True).stdout.strip()
    assert Requirement(f"ray=={lower_bound()}").specifier.contains(version), (version, lower_bound())
    run = subprocess.run([str(python), "-m", "pytest", "tests/workers/test_ray_executor.py", "-q", "-p",
                          "no:cacheprovider", "-k", AT_THE_BOUND], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"\b4 passed", run.stdout) and "skipped" not in run.stdout, run.stdout[-2000:]
