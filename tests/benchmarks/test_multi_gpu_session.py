"""benchmarks/multi_gpu_session.sh under DRY_CPU=1: every GPU command line it would run at world
sizes 2, 4 and 8 resolves (`run --dry-run`), and every step runs for real on 2 gloo ranks with the
quick presets at the script's CPU sizes (2 timed repetitions, 5 stability passes: the step runs,
the suites' own properties are test_parallel.py's), leaving at most 8 files (what the device
returns) with the results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# the two calls the script's header recommends (each returns at most 8 files from the device)
CALLS = (("plan", "nccl", "cplayer", "p2plate"), ("stability", "network", "network8l", "traj"))
STEPS = tuple(step for call in CALLS for step in call)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Both calls with one $OUT each; returns the first call's $OUT (the second's is `out2` in the
    same folder) and the last failing (else the last) process. The two calls are independent
    (their own $OUT, temporary folder and free ports), as on two device machines: they run side
    by side, each mostly one process at a time, so the second core is not left idle."""
    from concurrent.futures import ThreadPoolExecutor

    base = tmp_path_factory.mktemp("device-out")
    env = {**os.environ, "DRY_CPU": "1", "PYTHON": sys.executable}
    env.pop("NCCL_NVLS_ENABLE", None)

    def call(i: int) -> subprocess.CompletedProcess[str]:
        out = str(base / ("out" if i == 0 else f"out{i + 1}"))
        return subprocess.run(
            ["bash", "benchmarks/multi_gpu_session.sh", *CALLS[i]],
            cwd=ROOT, env={**env, "OUT": out}, capture_output=True, text=True, timeout=300,
        )

    with ThreadPoolExecutor(len(CALLS)) as pool:
        procs = list(pool.map(call, range(len(CALLS))))
    return base / "out", next((p for p in procs if p.returncode), procs[-1])


def _outs(out: Path) -> list[Path]:
    return [out, out.parent / "out2"]


def _read(out: Path, name: str) -> str:
    return next(d / name for d in _outs(out) if (d / name).is_file()).read_text()


def test_every_step_passes_and_the_files_fit_what_the_device_returns(session) -> None:  # type: ignore[no-untyped-def]
    out, proc = session
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = "".join((d / "summary.txt").read_text() for d in _outs(out))
    assert summary.count("failures=0") == 2
    for step in STEPS[1:]:
        assert f"{step} rc=0 " in summary
    for step in STEPS[2:]:
        assert f"{step} GPU command lines at N=2,4,8: --dry-run rc=0" in summary
    assert "[isolated] 2 ranks: passed" in summary
    files = [sorted(p.name for p in d.rglob("*") if p.is_file()) for d in _outs(out)]
    assert all(len(f) <= 8 for f in files), files
    assert {"summary.txt", "session.log", "cplayer.json", "p2plate.json"} <= set(files[0])
    assert {"summary.txt", "session.log", "traj.json"} <= set(files[1])


def test_the_gpu_command_lines_take_the_issue_lengths_per_world_size(session) -> None:  # type: ignore[no-untyped-def]
    out, _ = session
    log = "".join((d / "session.log").read_text() for d in _outs(out))
    # cp-layer full: CP2 16K/64K, CP4 16K/64K/128K, CP8 64K/128K, always the 8192/7777 padding case
    # and the packed 16K batch (the no-CP layer too); AllGather+eager stops at 32K, so at CP8 only
    # its padding and packed cases remain.
    assert "cp-layer --preset full --device cuda --world-size 2: 12 case(s)" in log
    assert "cp-layer --preset full --device cuda --world-size 4: 14 case(s)" in log
    assert "cp-layer --preset full --device cuda --world-size 8: 11 case(s)" in log
    assert "p2p_triton_T131072_B1" in log and "ulysses_triton_T8192_B2_valid7777" in log
    # stability and the network speed cases at 16K tokens per rank
    for n in (2, 4, 8):
        assert f"--param seq_len={16384 * n} --device cuda --world-size {n} --dry-run" in log
        assert f"--param passes=20 --param seq_len={16384 * n} --device cuda --world-size {n}" in log
    assert "--param model=qwen35-8l" in log
    assert "network --preset full --device cuda --world-size 8: 4 case(s)" in log  # speed, and traj
    for case in ("speed/p2p/ckpt-off", "speed/ulysses/ckpt-full", "traj/p2p/ckpt-full", "passes/ulysses"):
        assert case in log


def test_the_cpu_runs_recorded_every_case(session) -> None:  # type: ignore[no-untyped-def]
    out, _ = session
    expected = {
        "cplayer": 21,  # the quick preset: every mode incl. p2p_emulated and none, fp64 and fp32
        "p2plate": 5,  # P2P alone, fp64 and fp32, with the late state hand-off
        "stability": 3,
        "network": 4,
        "network8l": 4,
        "traj": 4,
    }
    for name, count in expected.items():
        doc = json.loads(_read(out, f"{name}.json"))
        assert (doc["device"], doc["world_size"], doc["exit_code"]) == ("cpu", 2, 0), name
        # AllGather over quick's packed batch is not applicable (a sequence crosses the boundary)
        skip = {c["name"] for c in doc["cases"] if c["name"].startswith("all_gather_eager_T160_B1_packed")}
        ok = all(c["status"] == ("skipped" if c["name"] in skip else "passed") for c in doc["cases"])
        assert len(doc["cases"]) == count and ok, name
    traj = json.loads(_read(out, "traj.json"))
    assert {c["name"] for c in traj["cases"]} == {f"traj/{m}/ckpt-{c}" for m in ("p2p", "ulysses")
                                                  for c in ("off", "full")}
    assert traj["params"]["steps"] == 5
    assert (out.parent / "out2" / "reference_traj_T128_S5_eager.json").is_file()  # copied for reuse
    assert json.loads(_read(out, "p2plate.json"))["params"]["p2p_early_state"] is False
    eight = json.loads(_read(out, "network8l.json"))
    assert eight["params"]["model"] == "tiny-8l"


def test_gpu_mode_plan_and_step_arguments_without_running(tmp_path: Path) -> None:
    """The GPU path of the script (NGPU set, no DRY_CPU): `plan` only resolves the suites, and a
    `traj:STEPS:LIMIT:SEQ:MODES` step is parsed into its command line (it cannot run here: the
    job fails for want of a CUDA device, which the summary reports)."""
    out = tmp_path / "out"
    env = {**os.environ, "NGPU": "8", "PYTHON": sys.executable, "OUT": str(out), "BUDGET": "200",
           "REFS": str(tmp_path / "refs")}
    env.pop("DRY_CPU", None)
    # DETERMINISTIC=1 (checked last) runs beside the first call: its own $OUT, nothing shared
    det_env = {**env, "OUT": str(tmp_path / "det"), "DETERMINISTIC": "1"}
    det = subprocess.Popen(["bash", "benchmarks/multi_gpu_session.sh", "traj:7:80:32768:\"p2p\""],
                           cwd=ROOT, env=det_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = subprocess.run(
        ["bash", "benchmarks/multi_gpu_session.sh", "plan", "traj:7:80:32768:\"p2p\""],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    det.wait(timeout=120)
    summary = (out / "summary.txt").read_text()
    assert "plan rc=0 (N=8" in summary
    log = (out / "session.log").read_text()
    assert "cp-layer --preset full --device cuda --world-size 8: 11 case(s)" in log
    traj = next(line for line in log.splitlines() if line.startswith("=== traj"))
    for part in ('modes=["p2p"]', "steps=7", "seq_len=32768", f"{tmp_path}/refs/traj_T32768_S7_eager.json",
                 "reference_checkpoint=full", "--world-size 8", "--deadline 60"):
        assert part in traj
    doc = json.loads((out / "traj.json").read_text())
    assert doc["exit_code"] == 2 and proc.returncode != 0
    assert [c["name"] for c in doc["cases"]] == ["traj/p2p/ckpt-off", "traj/p2p/ckpt-full"]
    assert "--deterministic" not in traj
    # DETERMINISTIC=1: the job runs deterministic, and its reference has a name of its own
    log = (tmp_path / "det" / "session.log").read_text()
    traj = next(line for line in log.splitlines() if line.startswith("=== traj"))
    assert "--deterministic" in traj and f"{tmp_path}/refs/traj_T32768_S7_eager_det.json" in traj
