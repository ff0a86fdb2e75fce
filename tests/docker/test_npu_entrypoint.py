"""docker/npu-entrypoint.sh under `bash -u` with stand-ins of the vendor's set_env.sh scripts.

The stand-ins do what the real scripts do that breaks strict shells: read unset variables
($ZSH_VERSION, $LD_LIBRARY_PATH), run tests that fail, end with a non-zero status. A `ray` on
PATH prints its arguments and the environment it got, so the test sees the entrypoint reach
`ray start` with the CANN environment loaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "npu-entrypoint.sh"

TOOLKIT_ENV = """\
# like CANN's ascend-toolkit/set_env.sh: bash/zsh detection, appends to possibly unset paths
if [ -n "$ZSH_VERSION" ]; then here="${(%):-%x}"; else here="${BASH_SOURCE[0]}"; fi
base="$(cd "$(dirname "$here")" && pwd)/latest"
export ASCEND_TOOLKIT_HOME="$base"
export ASCEND_HOME_PATH="$base"
export LD_LIBRARY_PATH="$base/lib64:$LD_LIBRARY_PATH"
export PYTHONPATH="$base/python/site-packages:$PYTHONPATH"
[ -d "$base/tools" ] && export PATH="$base/tools:$PATH"
"""

ATB_ENV = """\
# like NNAL's atb/set_env.sh: reads $ZSH_VERSION and ends with a failed test
if [ "$ZSH_VERSION" != "" ]; then script="${(%):-%N}"; else script="${BASH_SOURCE[0]}"; fi
export ATB_HOME_PATH="$(cd "$(dirname "$script")" && pwd)/latest/atb/cxx_abi_1"
export LD_LIBRARY_PATH="$ATB_HOME_PATH/lib:$LD_LIBRARY_PATH"
[ -n "$ATB_STREAM_SYNC_EVERY_KERNEL_ENABLE" ] && echo never
"""

RAY = """\
#!/usr/bin/env bash
printf 'argv=%s\\n' "$*"
printf 'ASCEND_TOOLKIT_HOME=%s\\n' "${ASCEND_TOOLKIT_HOME:-}"
printf 'ATB_HOME_PATH=%s\\n' "${ATB_HOME_PATH:-}"
printf 'LD_LIBRARY_PATH=%s\\n' "${LD_LIBRARY_PATH:-}"
"""


def _install(tmp: Path, *, atb: bool = True, toolkit: str | None = TOOLKIT_ENV) -> dict[str, str]:
    root = tmp / "Ascend"
    if toolkit is not None:
        (root / "ascend-toolkit").mkdir(parents=True)
        (root / "ascend-toolkit" / "set_env.sh").write_text(toolkit)
    if atb:
        (root / "nnal" / "atb").mkdir(parents=True)
        (root / "nnal" / "atb" / "set_env.sh").write_text(ATB_ENV)
    bindir = tmp / "bin"
    bindir.mkdir()
    (bindir / "ray").write_text(RAY)
    (bindir / "ray").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "ZSH_VERSION")}
    env.update(ASCEND_INSTALL_ROOT=str(root), PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
    return env


def _run(env: dict[str, str], *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-u", str(ENTRYPOINT), *cmd], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.fixture(autouse=True)
def _needs_bash():
    if shutil.which("bash") is None:
        pytest.skip("needs bash")


def test_entrypoint_survives_the_vendor_scripts_and_reaches_ray_start(tmp_path):
    env = _install(tmp_path)
    out = _run(env, "ray", "start", "--address=ray-head:6379", "--block")
    assert out.returncode == 0, out.stderr
    got = dict(line.split("=", 1) for line in out.stdout.strip().splitlines())
    assert got["argv"] == "start --address=ray-head:6379 --block"
    toolkit_home = str(tmp_path / "Ascend" / "ascend-toolkit" / "latest")
    assert got["ASCEND_TOOLKIT_HOME"] == toolkit_home
    assert got["ATB_HOME_PATH"].endswith("nnal/atb/latest/atb/cxx_abi_1")
    assert got["LD_LIBRARY_PATH"].startswith(got["ATB_HOME_PATH"] + "/lib:" + toolkit_home)
    assert "atb/set_env.sh returned 1" in out.stderr  # said, not fatal


def test_a_missing_toolkit_stops_the_container_with_the_reason(tmp_path):
    env = _install(tmp_path, toolkit=None)
    out = _run(env, "ray", "start", "--block")
    assert out.returncode == 78
    assert "no CANN toolkit environment under" in out.stderr and out.stdout == ""


def test_a_toolkit_that_loads_nothing_is_refused(tmp_path):
    env = _install(tmp_path, atb=False, toolkit="true\n")
    out = _run(env, "ray", "start", "--block")
    assert out.returncode == 78
    assert "set neither ASCEND_TOOLKIT_HOME nor ASCEND_HOME_PATH" in out.stderr and out.stdout == ""


def test_the_image_pins_the_version_set_docs_npu_names():
    dockerfile = (ROOT / "docker" / "Dockerfile.npu").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, flags=re.M))
    torch_v, npu_v = args["TORCH_VERSION"], args["TORCH_NPU_VERSION"]
    cann_v = re.match(r"ascendai/cann:([0-9a-z.]+)-", args["CANN_IMAGE"]).group(1)
    assert npu_v.split(".post")[0] == torch_v  # torch_npu X.Y.Z[.postN] is built for torch X.Y.Z
    doc = (ROOT / "docs" / "npu.md").read_text()
    assert f"| torch | {torch_v} |" in doc and f"| torch_npu | {npu_v} |" in doc
    assert f"`{args['CANN_IMAGE']}`) | {cann_v} |" in doc
    assert f"{npu_v} ↔ {torch_v} ↔ {cann_v}" in doc  # the table row it comes from
    assert "ENTRYPOINT [\"/usr/local/bin/gdnval-npu-entrypoint\"]" in dockerfile
