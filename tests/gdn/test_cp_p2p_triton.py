"""P2P with the Triton core (CPU interpreter, gloo): the early state hand-off against the late one
and against the no-CP core.

With `CPConfig.early_state` rank 0 sends its end state from inside the core (after the state
pass) and ranks >= 1 run their reverse-chain step from inside the core's backward (after the
reverse state pass). The arithmetic is the same as handing the states on after the whole pass,
so both must agree bit for bit, send the same messages, and match the core run without CP. Three
ranks give a middle rank (summary, receive-then-send in both directions) besides the first and the
last. The network test runs
the same hand-off inside the model with FSDP and activation checkpointing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gdn.ops import triton_interpreter_on
from tests.support.dist_harness import run_distributed

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not triton_interpreter_on(),
    reason="interpreter tests run on machines without a GPU (TRITON_INTERPRET=1)",
)

LOCAL_T = 80  # not a multiple of the chunk (64): every shard ends inside a chunk
NAMES = ("q", "k", "v", "g", "beta")
ROOT = Path(__file__).resolve().parents[2]
# the network test's job (see its docstring): model small-128 (head dim 128 for the kernels), P2P +
# Triton on 2 gloo ranks with FSDP, checkpoint off against the eager reference, determinism pair
NETWORK_RUN = ("network", "--preset", "quick", "--device", "cpu", "--world-size", "2",
               "--param", "model=small-128", "--param", "backend=triton", "--param", 'modes=["p2p"]',
               "--param", 'checkpoints=["off"]', "--param", "seq_len=128", "--param", "speed=false",
               "--param", 'determinism_modes=["p2p"]', "--param", "steps=2", "--param", "determinism_steps=1",
               "--param", "valid_lengths=null", "--param", "batch_size=1")


@pytest.fixture(scope="module", autouse=True)
def network_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The network test's `gdnval run`, started with the module: its P2P chain leaves a core idle
    while one rank waits for the other's state, and the core test below runs in that time (killed
    at the module's end if the network test did not wait for it)."""
    tmp = tmp_path_factory.mktemp("network")
    out = tmp / "net.json"
    with (tmp / "log.txt").open("w+") as log:
        cmd = [sys.executable, "-m", "service.cli", "run", *NETWORK_RUN, "--json", str(out)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            yield proc, out
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _inputs(world: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The whole sequence's inputs and output gradient, the same in every process."""
    from tests.support.gdn_inputs import make_inputs

    x = make_inputs(1, LOCAL_T * world, 1, 2, 128, dtype=torch.float32, stateful=False, seed=21)
    d_o = torch.randn(x.v.shape, generator=torch.Generator().manual_seed(5))
    return dict(zip(NAMES, x.tensors()[:5], strict=True)), d_o


def _rank(rank: int, world: int) -> dict[str, Any]:
    from gdn.cp import CPConfig
    from gdn.cp.p2p import p2p_gated_delta_rule

    full, d_o = _inputs(world)
    part = slice(rank * LOCAL_T, (rank + 1) * LOCAL_T)
    out: dict[str, Any] = {}
    for early in (True, False):
        cp = CPConfig("p2p", early_state=early)
        local = {n: t[:, part].clone().requires_grad_() for n, t in full.items()}
        o = p2p_gated_delta_rule(*local.values(), cp, backend="triton")
        o.backward(d_o[:, part])
        out[f"early={early}"] = {
            "o": o.detach(), **{f"d{n}": t.grad for n, t in local.items()},
            "sent": dict(cp.stats.sent), "received": dict(cp.stats.received),
        }
    return out


def _no_cp(world: int) -> dict[str, torch.Tensor]:
    """The core without CP over the whole sequence: output and input gradients."""
    from gdn import gated_delta_rule

    full, d_o = _inputs(world)
    ref = {n: t.clone().requires_grad_() for n, t in full.items()}
    o, _ = gated_delta_rule(*ref.values(), backend="triton")
    o.backward(d_o)
    return {"o": o.detach(), **{f"d{n}": t.grad for n, t in ref.items()}}


@pytest.mark.slow  # 3 gloo processes under the interpreter
def test_early_state_hand_off_equals_late_and_no_cp(one_torch_thread: None) -> None:
    """Three ranks: the first (sends forward only), a middle one and the last (receives forward
    only) are every role a rank has in the chain; two ranks would repeat the first and the last.
    The no-CP run is the same for every rank: it runs once, here, while the ranks run."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.gdn_inputs import rel_l2

    world = 3
    with ThreadPoolExecutor(1) as pool:
        no_cp_run = pool.submit(_no_cp, world)
        results = run_distributed(_rank, world, timeout_s=600)
        no_cp = no_cp_run.result()
    for rank, res in enumerate(results):
        part = slice(rank * LOCAL_T, (rank + 1) * LOCAL_T)
        early, late = res["early=True"], res["early=False"]
        ref = {name: t[:, part] for name, t in no_cp.items()}
        assert early["sent"] == late["sent"] and early["received"] == late["received"]
        assert early["sent"].get("state_fwd", 0) == (1 if rank + 1 < world else 0)
        assert early["sent"].get("state_bwd", 0) == (1 if rank > 0 else 0)
        for name in ("o", *(f"d{n}" for n in NAMES)):
            assert torch.equal(early[name], late[name]), f"rank {rank}: {name} differs early vs late"
            err = rel_l2(early[name], ref[name])
            assert err <= 2e-5, f"rank {rank}: {name} vs no-CP rel-L2 {err:.2e}"


@pytest.mark.slow
def test_network_p2p_triton_with_checkpointing(network_job: tuple[subprocess.Popen[str], Path]) -> None:
    """The whole model (head dim 128 for the kernels), P2P + Triton on 2 gloo ranks with FSDP: the
    checkpoint-off trajectory against the eager reference, and the determinism pair (checkpoint
    off vs full, whose recompute re-runs the forward's hand-offs) bit-identical. Together they
    prove the checkpoint-full trajectory matches the reference, so it is not run a third time.
    One chunk (64 tokens) per rank: the hand-offs, FSDP and the recompute do not depend on the
    shard length, and the chunk-to-chunk pass inside a shard is the core test's above (80). One
    step for the pair: its loss, gradients and updated parameters already pass every hand-off of
    the recompute; more steps repeat that code on other weights (the eager pair in
    test_parallel.py runs 10)."""
    import json

    proc, out = network_job
    proc.wait(timeout=900)
    log = (out.parent / "log.txt").read_text()
    assert proc.returncode == 0, log[-6000:]
    doc = json.loads(out.read_text())
    assert doc["params"]["backend"] == "triton" and doc["world_size"] == 2
    assert {c["name"]: c["status"] for c in doc["cases"]} == {
        "traj/p2p/ckpt-off": "passed", "determinism/p2p": "passed",
    }
    det = {s["metric"]: s["value"] for s in doc["samples"] if s["case"] == "determinism/p2p"}
    assert det["det_loss_identical"] == det["det_params_identical"] == 1.0
    assert det["det_max_param_diff"] == 0.0
