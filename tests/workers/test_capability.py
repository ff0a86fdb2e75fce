"""The capability suite: metadata without torch, `gdnval run capability` on a machine without the
service's dependencies, fail-fast reasons, and the wheel check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workers.provenance import SOURCE_ROOT
from workers.registry import get_suite

BLOCK_SERVICE_DEPS = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('fastapi', 'sqlalchemy', 'httpx', 'uvicorn', 'ray', 'alembic',
                                  'pydantic_settings', 'scipy', 'jinja2', 'yaml', 'multipart'):
            raise ImportError(f'{name} is not installed on the device machine')
        return None
sys.meta_path.insert(0, Block())
"""


def test_capability_metadata_imports_no_torch() -> None:
    code = """
        import json, sys
        from workers.registry import get_suite
        d = get_suite('capability').describe()
        print(json.dumps({'torch': 'torch' in sys.modules,
                          'quick': [c['name'] for c in d['presets']['quick']['cases']],
                          'gate': [c['name'] for c in d['presets']['gate']['cases']]}))
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=120, cwd=SOURCE_ROOT, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["torch"] is False
    assert "triton_available_T65536_hqk32" in got["quick"] and "failfast_backend_auto" in got["quick"]
    assert "wheel_contains_kernels" not in got["quick"] and "wheel_contains_kernels" in got["gate"]


@pytest.mark.slow  # a whole capability run in a subprocess
def test_gdnval_run_capability_needs_none_of_the_service_dependencies(tmp_path: Path) -> None:
    """The device machine has torch, triton, numpy, click, rich and pydantic only: the command, its
    rank processes and their fresh-interpreter checks all run with the rest made unimportable."""
    report = tmp_path / "cap.json"
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK_SERVICE_DEPS)  # every process started below
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    cmd = [sys.executable, "-m", "service.cli", "run", "capability", "--json", str(report)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=SOURCE_ROOT, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "verdict passed" in out.stdout and "capability" in out.stdout
    assert "not storing this run: the results store needs sqlalchemy" in out.stderr  # said, not silent
    doc = json.loads(report.read_text())
    assert doc["format"] == "gdnval-run/1" and doc["status"] == "succeeded" and doc["exit_code"] == 0
    cases = {c["name"]: c for c in doc["cases"]}
    suite = get_suite("capability")
    assert set(cases) == {c.name for c in suite.cases(suite.resolve_params("quick"))}
    for name in ("failfast_backend_auto", "failfast_head_dim_64_triton", "failfast_chunk_size_32_triton"):
        assert cases[name]["status"] == "expected_error"
        assert cases[name]["error"].startswith("UnsupportedGDNRequest")
    assert "head_dim" in cases["failfast_head_dim_64_triton"]["error"]
    assert "chunk_size=32" in cases["failfast_chunk_size_32_triton"]["error"]
    samples = {(s["case"], s["metric"]): s["value"] for s in doc["samples"]}
    assert samples[("import_gdn_is_lazy", "modules_loaded_by_import_gdn")] == 0.0
    assert samples[("eager_without_triton", "eager_no_triton_failfast")] == 1.0
    assert samples[("eager_without_triton", "eager_no_triton_max_abs")] < 1e-4
    # on CPU availability is recorded without a bound, never required
    assert ("triton_available_T8192_hqk16", "triton_available_recorded") in samples
    assert doc["info"]["device_kind"] == "cpu" and doc["commit"]


def test_a_fail_fast_error_for_the_wrong_reason_is_not_a_pass() -> None:
    import torch

    from workers.context import RankContext
    from workers.suite import Case

    suite = get_suite("capability")
    ctx = RankContext(rank=0, world_size=1, device=torch.device("cpu"), device_kind="cpu")
    params = {"check": "failfast", "backend": "triton", "chunk_size": 32, "reason": "head_dim"}
    case = Case("capability", "x", params, expected_error="UnsupportedGDNRequest")
    with pytest.raises(AssertionError, match="wrong reason: expected the message to name 'head_dim'"):
        list(suite.run(ctx, case))


@pytest.mark.slow
def test_wheel_in_an_isolated_venv_contains_and_imports_the_kernels(tmp_path: Path) -> None:
    from workers.packaging_check import check_wheel

    result = check_wheel(SOURCE_ROOT, tmp_path)
    assert result.ok, result.problems
    assert "kernels/__init__.py" in result.kernel_files and len(result.kernel_files) >= 2
    assert result.gdn_file.startswith(str(tmp_path / "venv"))
    assert result.kernels_file.startswith(str(tmp_path / "venv"))
    assert result.loaded_after_import_gdn == []
