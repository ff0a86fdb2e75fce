"""The NPU path on CPU: HCCL's collective rules emulated on gloo, HCCL's timeouts, the device
reason for Triton on npu, and presets that run on npu without Triton.

The acceptance runs go through `gdnval run ... --device cpu --world-size 2` with
GDNVAL_COLLECTIVES=hccl (the local executor's real rank processes); the rule checks run in two
gloo processes (tests.support.dist_harness).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from gdn import collectives
from gdn import device as devices
from gdn.parallel import check_fsdp_api
from tests.support.dist_harness import run_distributed
from workers.device_presets import adapt_preset
from workers.registry import get_suite

ROOT = Path(__file__).resolve().parents[2]
HCCL_ENV = {collectives.COLLECTIVES_ENV: "hccl"}


# ------------------------------------------------------------------------------ the rules


def _planted_fp64_all_reduce() -> None:
    collectives.all_reduce(torch.ones(3, dtype=torch.float64), None, "planted fp64 sum")


def _planted_timed_wait(work) -> None:
    work.wait(timedelta(seconds=1))


def _rank_rules(rank: int, world: int) -> dict[str, object]:
    import torch.distributed as dist

    from gdn.model import build_model
    from gdn.parallel import apply_fsdp, cp_device_mesh

    os.environ.update(HCCL_ENV)
    out: dict[str, object] = {"rules": collectives.rules()}
    try:
        _planted_fp64_all_reduce()
        out["fp64"] = "not refused"
    except collectives.CollectiveRefused as exc:
        out["fp64"] = str(exc)
    try:
        collectives.all_reduce(torch.ones(2, dtype=torch.float32), None, "avg", op=dist.ReduceOp.AVG)
        out["avg"] = "not refused"
    except collectives.CollectiveRefused as exc:
        out["avg"] = str(exc)
    # legal: fp32 all-reduce; the fp64 sum by gather + local sum keeps every digit
    t32 = torch.full((2,), float(rank + 1))
    collectives.all_reduce(t32, None, "fp32 sum")
    x64 = torch.tensor([1.0 + 1e-15 * (rank + 1), 1e-300 * (rank + 1)], dtype=torch.float64)
    s64 = collectives.sum_over(x64.clone(), None, "fp64 sum")
    out["fp32_sum"] = t32.tolist()
    out["fp64_sum"] = s64.tolist()
    out["fp64_expected"] = (torch.stack([
        torch.tensor([1.0 + 1e-15 * (r + 1), 1e-300 * (r + 1)], dtype=torch.float64) for r in range(world)
    ]).sum(0)).tolist()
    # work handles behave like HCCL's: wait(timeout) refused, the bounded wait polls
    peer = 1 - rank
    buf = torch.full((4,), float(rank))
    send = collectives.isend(buf, peer, None, 7, "probe send")
    got = torch.empty(4)
    recv = collectives.irecv(got, peer, None, 7, "probe recv")
    out["handle"] = type(recv).__name__
    try:
        _planted_timed_wait(recv)
        out["timed_wait"] = "not refused"
    except collectives.CollectiveRefused as exc:
        out["timed_wait"] = str(exc)
    collectives.wait(recv, timedelta(seconds=30), "probe recv")
    collectives.wait(send, timedelta(seconds=30), "probe send")
    out["received"] = got.tolist()
    # FSDP's own reduce-scatters are checked before sharding an fp64 model
    model = build_model("tiny", backend="eager", seed=0, device=torch.device("cpu")).double()
    try:
        apply_fsdp(model, cp_device_mesh(None, "cpu"))
        out["fsdp64"] = "not refused"
    except collectives.CollectiveRefused as exc:
        out["fsdp64"] = str(exc)
    out.update(_hung_peer(rank, HUNG_PEER_TIMEOUT_S))
    return out


HUNG_PEER_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def rules_run() -> list[dict[str, object]]:
    return run_distributed(_rank_rules, world_size=2, timeout_s=120)


@pytest.mark.slow  # two gloo processes (rules_run)
def test_planted_fp64_all_reduce_is_refused_naming_the_call_site(rules_run):
    line = _planted_fp64_all_reduce.__code__.co_firstlineno + 1
    for res in rules_run:
        assert res["rules"] == "hccl"
        msg = res["fp64"]
        assert f"tests/gdn/test_npu_path.py:{line} in _planted_fp64_all_reduce" in msg, msg
        assert "float64" in msg and "HCCL" in msg and "planted fp64 sum" in msg


@pytest.mark.slow  # two gloo processes (rules_run)
def test_hccl_rules_refuse_avg_and_fp64_fsdp(rules_run):
    for res in rules_run:
        assert "no reduce op" in res["avg"], res["avg"]
        assert "reduce_scatter of FSDP gradients" in res["fsdp64"] and "gdn/parallel.py:" in res["fsdp64"]


@pytest.mark.slow  # two gloo processes (rules_run)
def test_legal_reductions_and_exact_fp64_sum(rules_run):
    for res in rules_run:
        assert res["fp32_sum"] == [3.0, 3.0]
        assert res["fp64_sum"] == res["fp64_expected"]  # every digit, the same bits on both ranks
    assert rules_run[0]["fp64_sum"] == rules_run[1]["fp64_sum"]


@pytest.mark.slow  # two gloo processes (rules_run)
def test_timed_wait_is_refused_and_the_bounded_wait_polls(rules_run):
    line = _planted_timed_wait.__code__.co_firstlineno + 1
    for rank, res in enumerate(rules_run):
        assert res["handle"] == "HcclLikeWork"
        site = f"tests/gdn/test_npu_path.py:{line} in _planted_timed_wait"
        assert site in res["timed_wait"], res["timed_wait"]
        assert res["received"] == [float(1 - rank)] * 4


def _hung_peer(rank: int, timeout_s: float) -> dict[str, object]:
    """Rank 0 waits for a state rank 1 never sends (rank 1 is alive but stuck)."""
    import torch.distributed as dist

    from gdn.cp import CPCommError, CPConfig
    from gdn.cp.comm import recv_checked

    cp = CPConfig("p2p", timeout=timedelta(seconds=timeout_s))
    out: dict[str, object] = {}
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        start = time.monotonic()
        try:
            recv_checked(torch.empty(4), cp, 1, "state_fwd")
            out["hung_error"] = "no error"
        except CPCommError as exc:
            out["hung_error"] = f"{type(exc).__name__}: {exc}"
        out["hung_elapsed"] = time.monotonic() - start
        store.set("hung_peer_done", "1")
    else:
        store.wait(["hung_peer_done"], timedelta(seconds=120))
    return out


@pytest.mark.slow  # two gloo processes (rules_run)
def test_hung_peer_ends_in_cp_comm_error_within_the_timeout(rules_run):
    error = rules_run[0]["hung_error"]
    assert error.startswith("CPCommError: state_fwd recv #0 on rank 0 from rank 1"), error
    assert "polled is_completed()" in error
    res = rules_run[0]
    assert HUNG_PEER_TIMEOUT_S <= res["hung_elapsed"] < HUNG_PEER_TIMEOUT_S + 5.0


def test_rule_set_from_the_environment(monkeypatch):
    monkeypatch.setenv(collectives.COLLECTIVES_ENV, "nccl-ish")
    with pytest.raises(ValueError, match=r"GDNVAL_COLLECTIVES='nccl-ish' is not a rule set; expected one of"):
        collectives.emulated_rules()
    monkeypatch.delenv(collectives.COLLECTIVES_ENV)
    assert collectives.emulated_rules() == "native"


def _direct_collectives(path: Path) -> list[str]:
    names = {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_to_all",
             "all_to_all_single", "broadcast", "broadcast_object_list", "reduce_scatter",
             "reduce_scatter_tensor", "isend", "irecv", "send", "recv", "barrier", "reduce",
             "gather", "scatter", "batch_isend_irecv", "all_gather_object"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
                and node.value.id == "dist"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} dist.{node.attr}")
    return found


def test_every_collective_goes_through_gdn_collectives():
    # The case-end exchange of workers.runtime runs on its own gloo group (host objects), on
    # every device: the one call HCCL never sees.
    allowed = {"workers/runtime.py": {"all_gather_object"}}
    offenders = []
    for path in sorted([*ROOT.joinpath("gdn").rglob("*.py"), *ROOT.joinpath("workers").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "gdn/collectives.py":
            continue
        offenders += [f for f in _direct_collectives(path) if f.rsplit(".", 1)[1] not in allowed.get(rel, ())]
    assert offenders == []


# ------------------------------------------------------------------------------ timeouts, FSDP API


def test_hccl_timeouts_derive_from_the_job_limit():
    assert devices.collective_env("cpu", 100) == {} and devices.collective_env("cuda", 100) == {}
    env = devices.collective_env("npu", 930.0)
    assert env == {"HCCL_BLOCKING_WAIT": "1", "TORCH_HCCL_BLOCKING_WAIT": "1",
                   "HCCL_EXEC_TIMEOUT": "930", "HCCL_CONNECT_TIMEOUT": "930"}
    assert devices.collective_env("npu", 30)["HCCL_EXEC_TIMEOUT"] == "68"  # HCCL's ranges
    assert devices.collective_env("npu", 30)["HCCL_CONNECT_TIMEOUT"] == "120"
    assert devices.collective_env("npu", 1e6)["HCCL_EXEC_TIMEOUT"] == "17340"
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        devices.collective_env("npu", 0)


def test_fsdp_without_the_sum_api_fails_before_sharding():
    from torch.distributed.fsdp import FSDPModule

    check_fsdp_api(FSDPModule)  # this torch has it

    class OldFSDP:  # an FSDP2 from before mid-2025: divide factor only
        def set_gradient_divide_factor(self, factor: float) -> None: ...

    with pytest.raises(RuntimeError, match=r"has no FSDP2 set_force_sum_reduction_for_comms; fsdp=True"):
        check_fsdp_api(OldFSDP)


def test_npu_trace_needs_torch_npu_profiler():
    if devices.is_available("npu"):
        pytest.skip("torch_npu is installed here")
    with pytest.raises(RuntimeError, match="an NPU trace needs torch_npu"):
        devices.DeviceProfiler("npu")


# ------------------------------------------------------------------------------ Triton on npu, presets


NPU_CAPABILITY = """
import importlib.util, json, sys, torch
torch.utils.rename_privateuse1_backend("npu")  # what torch_npu does: the device kind exists
from gdn import UnsupportedGDNRequest, check_triton_gdn
from gdn.device import device_info
from workers.device_presets import device_refusal
from workers.registry import get_suite

def answer():
    try:
        check_triton_gdn((1, 8192, 16, 32, 128, 128), device="npu")
        check = None
    except UnsupportedGDNRequest as exc:
        check = str(exc)
    suite = get_suite("network")
    params = suite.resolve_params("gate", device="npu")
    return {"check": check, "backend": params.backend,
            "refusal": device_refusal(suite.backends(params), torch.device("npu")),
            "info": device_info("npu")}

out = {"without": answer()}
sys.path.insert(0, sys.argv[1])  # a site directory holding triton-ascend's metadata
out["with"] = answer()
print(json.dumps(out))
"""


def test_npu_keeps_triton_and_fails_fast_without_triton_ascend(tmp_path):
    """The capability check's input is the installed distribution: a site directory with
    triton-ascend's metadata (what pip writes) answers yes, its absence answers no."""
    dist = tmp_path / "site" / "triton_ascend-3.2.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: triton-ascend\nVersion: 3.2.0\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", NPU_CAPABILITY, str(tmp_path / "site")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    without, with_ = got["without"], got["with"]
    assert without["backend"] == with_["backend"] == "triton"  # the preset is never swapped for eager
    assert "needs triton-ascend" in without["check"] and "backend='eager'" in without["check"]
    assert without["refusal"].startswith("backend 'triton' cannot run on npu:")
    assert "triton-ascend" in without["refusal"]
    assert with_["check"] is None and with_["refusal"] is None
    # every NPU job's environment names the Ascend software (None: not installed on this machine)
    assert {k: without["info"][k] for k in ("cann", "torch_npu", "triton_ascend")} == {
        "cann": None, "torch_npu": None, "triton_ascend": None}
    assert with_["info"]["triton_ascend"] == "3.2.0"


def _backends_named(params: dict) -> set[str]:
    named = {v for k, v in params.items() if k.endswith("backend") and isinstance(v, str)}
    named |= set(params.get("backends", ()) or ())
    named |= {c.partition("+")[2] for c in params.get("candidates", ()) or ()}
    return named


@pytest.mark.parametrize("preset", ["quick", "gate-cpu", "gate", "full"])
def test_every_suite_keeps_triton_on_npu(preset):
    from workers.registry import SUITE_MODULES

    built_in = sorted(n for n, module in SUITE_MODULES.items() if module.startswith("workers.suites."))
    for name in built_in:  # test suites registered by other test modules are not the project's
        suite = get_suite(name)
        assert "npu" in suite.devices, name
        as_written = _backends_named(suite.resolve_params(preset).model_dump())
        on_npu = _backends_named(suite.resolve_params(preset, device="npu").model_dump())
        assert on_npu <= {"triton", "eager"}, (name, preset, on_npu)
        assert on_npu & {"triton"} == as_written & {"triton"}, (name, preset)  # never swapped for eager
        assert suite.cases(suite.resolve_params(preset, device="npu")), (name, preset)
    assert get_suite("network").resolve_params("gate", device="npu").backend == "triton"
    assert get_suite("network").resolve_params("gate").backend == "triton"


def test_the_rule_maps_cuda_only_backends_to_triton():
    assert adapt_preset({"candidates": ("ulysses+fla", "ulysses+eager", "p2p+triton")}, "npu") == {
        "candidates": ("ulysses+triton", "ulysses+eager", "p2p+triton")
    }
    assert adapt_preset({"backends": ("triton", "fla")}, "npu") == {"backends": ("triton",)}
    assert adapt_preset({"backends": ("flashqla",)}, "npu") == {"backends": ("triton",)}
    assert adapt_preset({"backend": "fla"}, "cuda") == {"backend": "fla"}


def _cli(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "run", *args], capture_output=True, text=True, timeout=timeout,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_dry_run_network_gate_on_npu_lists_cases():
    out = _cli("network", "--preset", "gate", "--device", "npu", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "network --preset gate --device npu --world-size 1: 5 case(s)" in out.stdout
    assert "traj/none/ckpt-off" in out.stdout


# ------------------------------------------------------------------------------ acceptance runs


QUICK_RUNS = {
    "cp-layer": ("cp-layer", "--preset", "quick"),
    "stability": ("stability", "--preset", "quick"),
    # network quick cut to its P2P trajectories with FSDP (checkpoint off and full); the whole
    # preset passes too (docs/npu.md), at ~85 s more than this file's CI share
    "network": ("network", "--preset", "quick", "--param", 'modes=["p2p"]', "--param", "steps=3",
                "--param", "speed=false", "--param", "determinism=false"),
}


@pytest.fixture(scope="module")
def quick_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The selected suites' 2-rank jobs, started side by side (own processes, ports and JSON
    each: a 2-rank job waits on its peer's collectives and leaves a core idle); each test below
    checks its own. Yields {suite: (process, JSON path, log path)}."""
    test = "test_quick_suites_pass_on_two_gloo_ranks_under_hccl_rules"
    wanted = {item.callspec.id for item in request.session.items if getattr(item, "originalname", "") == test}
    tmp = tmp_path_factory.mktemp("quick-runs")
    env = {**os.environ, "PYTHONPATH": str(ROOT), **HCCL_ENV}
    runs = {}
    try:
        for name in (n for n in QUICK_RUNS if n in wanted):
            out_json, log = tmp / f"{name}.json", tmp / f"{name}.log"
            cmd = [sys.executable, "-m", "service.cli", "run", *QUICK_RUNS[name], "--device", "cpu",
                   "--world-size", "2", "--json", str(out_json)]
            with log.open("w") as f:
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
            runs[name] = (proc, out_json, log)
        yield runs
    finally:
        for proc, _, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow  # a 2-rank job per suite, the three side by side
@pytest.mark.parametrize("suite", list(QUICK_RUNS))
def test_quick_suites_pass_on_two_gloo_ranks_under_hccl_rules(suite, quick_runs):
    proc, out_json, log = quick_runs[suite]
    proc.wait(timeout=300)
    assert proc.returncode == 0, log.read_text()[-6000:]
    doc = json.loads(out_json.read_text())
    assert doc["status"] == "succeeded" and doc["cases"]
    # skipped: only a case that cannot apply (cp-layer's AllGather over its packed batch)
    assert all(c["status"] in ("passed", "expected_error")
               or (c["status"] == "skipped" and "not applicable" in c["error"]) for c in doc["cases"])
