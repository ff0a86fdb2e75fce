"""The layer on a packed batch (`cu_seqlens`, B = 1): the conv and the core restart at every
sequence, so the packed layer equals the layer run on each sequence alone (fp64, CPU), outputs,
input gradients and parameter gradients alike. Under CP (3 gloo ranks, so that a middle rank
passes a state on): Ulysses is exact for any packing; P2P is exact for any packing too, with
sequences crossing one or two rank boundaries, starting exactly on one, or a middle rank holding
the end of one sequence and the start of the next; AllGather is exact when every rank boundary
is a sequence boundary and refuses a sequence that crosses one, naming the sequence and the
boundary."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import torch

from gdn.layer import GatedDeltaNet, GDNLayerConfig, gdn_layer_init_
from tests.support.dist_harness import run_distributed

TOL = 1e-9
CFG = GDNLayerConfig(hidden_size=32, num_qk_heads=2, num_v_heads=4, head_dim=8)
# 1, 63, 64, 65 and a chunk boundary (64) inside the last two sequences
LENS = (1, 63, 64, 65, 70)
CFG3 = GDNLayerConfig(hidden_size=24, num_qk_heads=3, num_v_heads=6, head_dim=8)  # heads split over 3 ranks
P, T_LOCAL = 3, 64
ALIGNED = (5, 59, 64, 30, 34)  # T = 192: the boundaries 64 and 128 are sequence boundaries
CROSSING = {
    "two_boundaries": (5, 150, 37),  # sequence 1, tokens [5, 155), crosses 64 and 128
    "end_and_start": (5, 95, 40, 52),  # rank 1 holds the end of one sequence and the start of the next
    "starts_on_one": (64, 100, 28),  # sequence 1 starts on the boundary 64 and crosses 128
}


def _layer(cp: Any = None, cfg: GDNLayerConfig = CFG) -> GatedDeltaNet:
    return gdn_layer_init_(GatedDeltaNet(cfg, cp=cp), seed=7).double()


def _inputs(T: int, cfg: GDNLayerConfig = CFG) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1, T, cfg.hidden_size, generator=gen, dtype=torch.float64)
    dy = torch.randn(1, T, cfg.hidden_size, generator=gen, dtype=torch.float64)
    return x, dy


def _cu(lens: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def _run(layer: GatedDeltaNet, x: torch.Tensor, dy: torch.Tensor, cu: torch.Tensor | None) -> dict[str, Any]:
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    y = layer(x, cu_seqlens=cu)
    y.backward(dy)
    return {"y": y.detach(), "dx": x.grad, "params": {n: p.grad.clone() for n, p in layer.named_parameters()}}


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    out = {"y": (a["y"] - b["y"]).abs().max().item(), "dx": (a["dx"] - b["dx"]).abs().max().item()}
    out.update({n: (a["params"][n] - b["params"][n]).abs().max().item() for n in a["params"]})
    return out


def test_a_packed_batch_equals_each_sequence_alone() -> None:
    layer = _layer()
    x, dy = _inputs(sum(LENS))
    packed = _run(layer, x, dy, _cu(LENS))
    cu = _cu(LENS).tolist()
    alone = [_run(layer, x[:, a:b], dy[:, a:b], None) for a, b in pairwise(cu)]
    joined = {
        "y": torch.cat([r["y"] for r in alone], 1), "dx": torch.cat([r["dx"] for r in alone], 1),
        "params": {n: sum(r["params"][n] for r in alone) for n in packed["params"]},
    }
    diffs = _max_diff(packed, joined)
    assert max(diffs.values()) <= TOL, diffs
    # the restart matters: the same tokens as one sequence give another output
    dense = _run(layer, x, dy, None)
    assert (dense["y"] - packed["y"]).abs().max().item() > 1e-3


def test_bad_offsets_name_the_value() -> None:
    layer = _layer()
    x, _ = _inputs(10)
    with pytest.raises(ValueError, match="must end at T=10"):
        layer(x, cu_seqlens=torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match="need batch 1"):
        layer(torch.cat([x, x]), cu_seqlens=torch.tensor([0, 4, 10]))


RUNS = [("ulysses", "two_boundaries", CROSSING["two_boundaries"]), ("p2p", "aligned", ALIGNED),
        ("all_gather", "aligned", ALIGNED), *(("p2p", name, lens) for name, lens in CROSSING.items())]


def _rank(rank: int, world: int, refs: dict[tuple[int, ...], dict[str, Any]]) -> dict[str, Any]:
    from gdn.cp import CPConfig
    from gdn.cp.config import CPError

    out: dict[str, Any] = {}
    lo, hi = rank * T_LOCAL, (rank + 1) * T_LOCAL
    for mode, name, lens in RUNS:
        x, dy = _inputs(sum(lens), CFG3)
        got = _run(_layer(CPConfig(mode), CFG3), x[:, lo:hi], dy[:, lo:hi], _cu(lens))  # type: ignore[arg-type]
        for g in got["params"].values():
            torch.distributed.all_reduce(g)
        ref = refs[lens]
        out[f"{mode}/{name}"] = _max_diff(got, {**ref, "y": ref["y"][:, lo:hi], "dx": ref["dx"][:, lo:hi]})
    x, _ = _inputs(P * T_LOCAL, CFG3)
    try:
        _layer(CPConfig("all_gather"), CFG3)(x[:, rank * T_LOCAL : (rank + 1) * T_LOCAL],
                                             cu_seqlens=_cu(CROSSING["two_boundaries"]))
        out["all_gather_crossing"] = "no error"
    except CPError as exc:
        out["all_gather_crossing"] = str(exc)
    return out


@pytest.fixture(scope="module")
def cp3() -> list[dict[str, Any]]:
    refs = {}  # the no-CP packed layer, once here rather than on every rank
    for _, _, lens in RUNS:
        if lens not in refs:
            x, dy = _inputs(sum(lens), CFG3)
            refs[lens] = _run(_layer(cfg=CFG3), x, dy, _cu(lens))
    return run_distributed(_rank, P, args=(refs,), timeout_s=120)


@pytest.mark.parametrize("run", ["ulysses/two_boundaries", "p2p/aligned", "all_gather/aligned",
                                 *(f"p2p/{name}" for name in CROSSING)])
def test_packed_cp_equals_the_packed_layer(cp3: list[dict[str, Any]], run: str) -> None:
    for rank, res in enumerate(cp3):
        assert max(res[run].values()) <= TOL, (rank, res[run])


def test_all_gather_refuses_a_sequence_across_a_rank_boundary_naming_it(cp3: list[dict[str, Any]]) -> None:
    for res in cp3:
        msg = res["all_gather_crossing"]
        assert "CP mode 'all_gather'" in msg and "sequence 1 (tokens [5, 155))" in msg, msg
        assert "boundary at token 64 between rank 0 and rank 1" in msg and "'p2p'" in msg, msg
