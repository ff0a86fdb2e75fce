"""CP modes against the no-CP layer on CPU: gloo, 2 and 4 processes, fp64, eager.

Each world size is one spawn running every case (process start-up dominates on 2 cores). The
padding case is the scaled-down twin of the report's B=2, 8192/7777 on CP4: global 320, valid 301
in row 1; 301 divides neither the local length (80 on CP4, 160 on CP2) nor the chunk 64, so the
valid/padding boundary falls inside a chunk of the last rank.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch

from tests.support.dist_harness import run_distributed

MODES = ("ulysses", "p2p", "all_gather")
CASES = {  # name -> (batch, global length, valid length of rows >= 1)
    "pad_b2": (2, 320, 301),
    "nopad_b1": (1, 128, None),
}
TOL = 1e-9


def _config():
    from gdn.layer import GDNLayerConfig

    return GDNLayerConfig(hidden_size=64, num_qk_heads=4, num_v_heads=8, head_dim=8)


def _rank_all_modes(rank: int, world: int) -> dict[str, Any]:
    from gdn.cp import CPConfig
    from workers.harness.cp_compare import LayerCase, compare_layer
    from workers.measure import worst_rel_l2

    out: dict[str, Any] = {}
    for mode in MODES:
        for name, (batch, T, valid) in CASES.items():
            cp = CPConfig(mode)  # type: ignore[arg-type]
            case = LayerCase(_config(), mode, batch=batch, seq_len=T, valid_len=valid, seed=3)
            cmp = compare_layer(case, cp, torch.device("cpu"))
            out[f"{mode}/{name}"] = {
                "errors": worst_rel_l2(cmp),
                "padding_max_abs": cmp.padding_max_abs,
                "grad_norm": cmp.grad_norm,
                "sent": dict(cp.stats.sent),
                "received": dict(cp.stats.received),
                "order_checks": cp.stats.order_checks,
            }
    return out


def _rank_everything(rank: int, world: int) -> dict[str, Any]:
    """One spawn per world size (process start-up dominates on 2 cores). On CP2 the stacked-layer
    and bad-input checks run too; the bad-input ones last, as the order test desynchronises."""
    out = {"modes": _rank_all_modes(rank, world)}
    if world == 2:
        out["stack"] = _rank_stack(rank, world)
        out["errors"] = _rank_errors(rank, world)
    return out


_RUNS: dict[int, list[dict[str, Any]]] = {}


def _run(world: int) -> list[dict[str, Any]]:
    if world not in _RUNS:
        _RUNS[world] = run_distributed(_rank_everything, world, timeout_s=300)
    return _RUNS[world]


@pytest.fixture(scope="module", params=[2, 4], ids=["cp2", "cp4"])
def results(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    world = request.param
    return world, [r["modes"] for r in _run(world)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_mode_equals_reference(results: tuple[int, list[dict[str, Any]]], mode: str, case: str) -> None:
    world, per_rank = results
    for rank, res in enumerate(per_rank):
        r = res[f"{mode}/{case}"]
        worst = max(r["errors"].items(), key=lambda kv: kv[1])
        assert worst[1] <= TOL, f"cp{world} rank {rank} {mode}/{case}: {worst[0]} rel-L2 {worst[1]:.3e}"
        assert len(r["errors"]) == 11  # output, input grad and all 9 parameter gradients
        g_cp, g_ref = r["grad_norm"]
        assert abs(g_cp - g_ref) <= TOL * g_ref
        assert r["padding_max_abs"] == 0.0
    if CASES[case][2] is not None:  # the boundary lies on the last rank, inside a chunk
        T, valid = CASES[case][1], CASES[case][2]
        local = T // world
        assert valid // local == world - 1 and valid % local % 64 != 0 and valid % 64 != 0


@pytest.mark.slow
def test_hops_are_counted_and_checked(results: tuple[int, list[dict[str, Any]]]) -> None:
    world, per_rank = results
    for rank, res in enumerate(per_rank):
        r = res["p2p/pad_b2"]
        first, last = rank == 0, rank == world - 1
        assert r["sent"].get("state_fwd", 0) == (0 if last else 1)
        assert r["received"].get("state_fwd", 0) == (0 if first else 1)
        assert r["sent"].get("state_bwd", 0) == (0 if first else 1)
        assert r["received"].get("state_bwd", 0) == (0 if last else 1)
        assert r["sent"].get("halo_fwd", 0) == (0 if last else 1)
        assert r["received"].get("halo_bwd", 0) == (0 if last else 1)
        assert r["order_checks"] == sum(r["received"].values())
        u = res["ulysses/pad_b2"]
        assert u["sent"] == {} and u["received"] == {}  # Ulysses moves heads, never states
        ag = res["all_gather/pad_b2"]
        assert "state_fwd" not in ag["sent"] and "state_bwd" not in ag["sent"]


# ------------------------------------------------------------------------------ errors


def _rank_errors(rank: int, world: int) -> dict[str, str]:
    import torch.distributed as dist

    from gdn import UnsupportedGDNRequest
    from gdn.cp import CPCommError, CPConfig, CPError
    from gdn.layer import GatedDeltaNet, GDNLayerConfig
    from workers.harness.cp_compare import sum_param_grads

    errors: dict[str, str] = {}

    def expect(name: str, exc: type[BaseException], fn) -> None:
        try:
            fn()
        except exc as e:
            errors[name] = f"{type(e).__name__}: {e}"
        else:
            errors[name] = "no error"

    cfg = _config()
    odd = GDNLayerConfig(hidden_size=16, num_qk_heads=1, num_v_heads=3, head_dim=4)
    expect("ulysses_heads", CPError, lambda: GatedDeltaNet(odd, cp=CPConfig("ulysses")))
    expect(
        "all_gather_triton",
        UnsupportedGDNRequest,
        lambda: GatedDeltaNet(cfg, backend="triton", cp=CPConfig("all_gather")),
    )
    expect("group_size", CPError, lambda: CPConfig("p2p").check_world_size(world + 2))
    layer = GatedDeltaNet(cfg, cp=CPConfig("p2p")).double()
    expect("halo", CPError, lambda: layer(torch.randn(1, 2, 64, dtype=torch.float64)))
    x = torch.randn(2, 8, 64, dtype=torch.float64)
    expect("mask_shape", ValueError, lambda: layer(x, torch.ones(2, 7, dtype=torch.float64)))
    # Ranks that hold different shard lengths are caught before any transfer can hang.
    mismatched = torch.randn(1, 8 + rank, 64, dtype=torch.float64)
    expect("shape_mismatch", CPError, lambda: GatedDeltaNet(cfg, cp=CPConfig("ulysses")).double()(mismatched))

    # Order check and timeout: rank 1 skips a sequence number, so it rejects the message it gets;
    # rank 0 then waits in backward for a gradient that never comes and times out.
    cp = CPConfig("p2p", timeout=timedelta(seconds=3))
    if rank == 1:
        cp.stats.next_seq("state_fwd", "recv", 0)

    def chain() -> None:
        lay = GatedDeltaNet(cfg, cp=cp).double()
        y = lay(torch.randn(1, 16, 64, dtype=torch.float64))
        y.sum().backward()
        sum_param_grads(lay, cp)

    expect("order", CPCommError, chain)
    # Rank 1 stays connected until rank 0 has timed out (a closed peer would fail it faster).
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("order_test_done", "1")
    else:
        store.wait(["order_test_done"], timedelta(seconds=120))
    return errors


@pytest.mark.slow
def test_bad_inputs_raise_clear_errors() -> None:
    for rank, errs in enumerate(r["errors"] for r in _run(2)):
        assert (
            "num_qk_heads=1, num_v_heads=3" in errs["ulysses_heads"] and "CP size 2" in errs["ulysses_heads"]
        )
        assert "all_gather" in errs["all_gather_triton"] and "eager" in errs["all_gather_triton"]
        assert f"has 2 ranks, expected {2 + 2}" in errs["group_size"]
        assert "local sequence length 2 is shorter than the Conv1D halo 3" in errs["halo"]
        assert "got shape (2, 7)" in errs["mask_shape"]
        assert "rank 0: (1, 8, 64), rank 1: (1, 9, 64)" in errs["shape_mismatch"]
        if rank == 1:
            assert (
                "order mismatch" in errs["order"]
                and "expected state_fwd message #1 from rank 0" in errs["order"]
            )
        else:
            assert "state_bwd recv #0 on rank 0 from rank 1" in errs["order"] and "timed out" in errs["order"]


def _rank_stack(rank: int, world: int) -> dict[str, float]:
    """Two layers sharing one CPConfig, the second under non-reentrant activation checkpoint, two
    fwd+bwd passes per mode: the channels stay in step across layers, passes and recomputation
    (a recomputed forward stops early, so its sends must still be delivered)."""
    from torch.utils.checkpoint import checkpoint

    from gdn.cp import CPConfig, shard_sequence
    from workers.harness.cp_compare import sum_param_grads
    from workers.measure import tensor_error

    def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
        return tensor_error(a, b).rel_l2
    from gdn.layer import GatedDeltaNet, gdn_layer_init_

    def stack(cp):
        return [gdn_layer_init_(GatedDeltaNet(_config(), cp=cp), s).double() for s in (1, 2)]

    def run(layers, x, mask, ckpt: bool):
        h = x + layers[0](x, mask)
        out = checkpoint(layers[1], h, mask, use_reentrant=False) if ckpt else layers[1](h, mask)
        return h + out

    worst: dict[str, float] = {}
    gen = torch.Generator().manual_seed(11)
    for mode in MODES:
        cp = CPConfig(mode, timeout=timedelta(seconds=20))  # type: ignore[arg-type]
        layers, ref = stack(cp), stack(None)
        err = 0.0
        for step in range(2):
            x = torch.randn(2, 96, 64, generator=gen, dtype=torch.float64)
            mask = torch.ones(2, 96, dtype=torch.float64)
            mask[1, 90 - step :] = 0
            for lay in layers + ref:
                lay.zero_grad()
            y_ref = run(ref, x, mask, False)
            y_ref.pow(2).sum().backward()
            y = run(layers, shard_sequence(x, cp, 1), shard_sequence(mask, cp, 1), True)
            y.pow(2).sum().backward()
            for lay in layers:
                sum_param_grads(lay, cp)
            err = max(err, rel_l2(y, shard_sequence(y_ref, cp, 1)))
            for a, b in zip(layers, ref, strict=True):
                for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
                    err = max(err, rel_l2(pa.grad, pb.grad))
        worst[mode] = err
        worst[f"{mode}_checks"] = float(cp.stats.order_checks)
    return worst


@pytest.mark.slow
def test_stacked_layers_checkpoint_and_repeated_passes() -> None:
    for rank, res in enumerate(r["stack"] for r in _run(2)):
        for mode in MODES:
            assert res[mode] <= TOL, f"rank {rank} {mode}: {res[mode]:.3e}"
        # p2p, received and order-checked: rank 1 gets a state and a halo message per forward of
        # each layer, and the checkpointed layer runs its forward twice (recomputation): 2 passes x
        # 3 forwards x 2 kinds; rank 0 gets their two gradients per layer backward: 2 x 2 x 2.
        assert res["p2p_checks"] == (2 * 2 * 2 if rank == 0 else 2 * 3 * 2)


def test_cp_config_without_process_group() -> None:
    from gdn.cp import CPConfig, CPError

    with pytest.raises(CPError, match=r"initialised torch\.distributed"):
        CPConfig("p2p")
    with pytest.raises(CPError, match="unknown CP mode 'ring'"):
        CPConfig("ring")  # type: ignore[arg-type]
    assert CPConfig("none").world_size == 1 and not CPConfig("none").enabled


def test_shard_sequence_contiguous_and_divisibility() -> None:
    from gdn.cp import CPError, shard_range

    assert [shard_range(12, 3, r) for r in range(3)] == [(0, 4), (4, 8), (8, 12)]
    with pytest.raises(CPError, match="sequence length 10 is not divisible by the CP size 4"):
        shard_range(10, 4, 0)
