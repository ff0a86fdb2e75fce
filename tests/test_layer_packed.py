"""The layer on a packed batch (`cu_seqlens`, B = 1): the conv and the core restart at every
sequence, so the packed layer equals the layer run on each sequence alone (fp64, CPU), outputs,
input gradients and parameter gradients alike. Under CP (2 gloo ranks): Ulysses is exact for any
packing; P2P and AllGather are exact when every rank boundary is a sequence boundary, and refuse
a sequence that crosses one, naming the sequence and the boundary."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import torch

from gdn.layer import GatedDeltaNet, GDNLayerConfig, gdn_layer_init_
from tests.dist_harness import run_distributed

TOL = 1e-9
CFG = GDNLayerConfig(hidden_size=32, num_qk_heads=2, num_v_heads=4, head_dim=8)
# 1, 63, 64, 65 and a chunk boundary (64) inside the last two sequences
LENS = (1, 63, 64, 65, 70)
ALIGNED = (5, 59, 30, 34)  # T = 128: the CP2 boundary (64) is a sequence boundary
CROSSING = (5, 60, 63)  # sequence 1 holds tokens [5, 65): it crosses the boundary at 64


def _layer(cp: Any = None) -> GatedDeltaNet:
    return gdn_layer_init_(GatedDeltaNet(CFG, cp=cp), seed=7).double()


def _inputs(T: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1, T, CFG.hidden_size, generator=gen, dtype=torch.float64)
    dy = torch.randn(1, T, CFG.hidden_size, generator=gen, dtype=torch.float64)
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
    }  # fmt: skip
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


def _rank(rank: int, world: int) -> dict[str, Any]:
    from gdn.cp import CPConfig
    from gdn.cp.config import CPError

    out: dict[str, Any] = {}
    for mode, lens in (("ulysses", CROSSING), ("p2p", ALIGNED), ("all_gather", ALIGNED)):
        x, dy = _inputs(sum(lens))
        ref = _run(_layer(), x, dy, _cu(lens))
        lo, hi = rank * x.shape[1] // world, (rank + 1) * x.shape[1] // world
        got = _run(_layer(CPConfig(mode)), x[:, lo:hi], dy[:, lo:hi], _cu(lens))  # type: ignore[arg-type]
        for g in got["params"].values():
            torch.distributed.all_reduce(g)
        ref["y"], ref["dx"] = ref["y"][:, lo:hi], ref["dx"][:, lo:hi]
        out[mode] = _max_diff(got, ref)
    x, _ = _inputs(sum(CROSSING))
    for mode in ("p2p", "all_gather"):
        try:
            _layer(CPConfig(mode))(x[:, rank * 64 : (rank + 1) * 64], cu_seqlens=_cu(CROSSING))  # type: ignore[arg-type]
            out[f"{mode}_crossing"] = "no error"
        except CPError as exc:
            out[f"{mode}_crossing"] = str(exc)
    return out


@pytest.fixture(scope="module")
def cp2() -> list[dict[str, Any]]:
    return run_distributed(_rank, 2, timeout_s=120)


@pytest.mark.parametrize("mode", ["ulysses", "p2p", "all_gather"])
def test_packed_cp_equals_the_packed_layer(cp2: list[dict[str, Any]], mode: str) -> None:
    for rank, res in enumerate(cp2):
        assert max(res[mode].values()) <= TOL, (rank, res[mode])


@pytest.mark.parametrize("mode", ["p2p", "all_gather"])
def test_a_sequence_across_a_rank_boundary_is_refused_naming_it(cp2: list[dict[str, Any]], mode: str) -> None:
    for res in cp2:
        msg = res[f"{mode}_crossing"]
        assert f"CP mode {mode!r}" in msg and "sequence 1 (tokens [5, 65))" in msg, msg
        assert "boundary at token 64 between rank 0 and rank 1" in msg, msg
