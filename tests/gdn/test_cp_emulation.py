"""Shard summaries and the single-process P2P emulation, eager fp64 on CPU (no processes)."""

from __future__ import annotations

import pytest
import torch

from gdn import gated_delta_rule
from gdn.cp import CPError, apply_transition, merge_prefix, state_summary
from gdn.cp.emulation import EmulationStats, emulated_p2p_gated_delta_rule, emulated_p2p_layer
from gdn.layer import GatedDeltaNet, GDNLayerConfig, gdn_layer_init_
from tests.support.gdn_inputs import make_inputs, rel_l2

TOL = 1e-9


def test_final_state_is_affine_in_the_initial_state() -> None:
    x = make_inputs(2, 90, 2, 4, 8, stateful=True, seed=1)
    m, ext = state_summary(x.q, x.k, x.v, x.g, x.beta, backend="eager")
    _, direct = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True)
    assert rel_l2(apply_transition(m, x.h0, ext), direct) <= TOL
    _, from_zero = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, output_final_state=True)
    assert rel_l2(ext, from_zero) <= TOL
    assert m.shape == (2, 4, 8, 8)


def test_merge_prefix_equals_sequential_run() -> None:
    x = make_inputs(1, 120, 1, 2, 8, stateful=False, seed=2)
    pieces = [slice(0, 40), slice(40, 80), slice(80, 120)]
    ms, exts = [], []
    for sl in pieces:
        m, e = state_summary(x.q[:, sl], x.k[:, sl], x.v[:, sl], x.g[:, sl], x.beta[:, sl], backend="eager")
        ms.append(m)
        exts.append(e)
    _, direct = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, output_final_state=True)
    assert rel_l2(merge_prefix(ms, exts), direct) <= TOL


@pytest.mark.parametrize("shards", [2, 4, 5])
def test_emulated_core_equals_full_run_with_gradients(shards: int) -> None:
    # 200 tokens: shards of 100/50/40 do not align with the chunk of 64.
    x = make_inputs(2, 200, 2, 4, 8, stateful=True, seed=shards).requires_grad_()
    do = torch.randn(2, 200, 4, 8, dtype=torch.float64)
    dht = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    stats = EmulationStats()
    o, ht = emulated_p2p_gated_delta_rule(
        x.q, x.k, x.v, x.g, x.beta, num_shards=shards, initial_state=x.h0, stats=stats
    )
    grads = torch.autograd.grad([o, ht], x.tensors(), [do, dht])
    o_ref, ht_ref = gated_delta_rule(
        x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True
    )
    grads_ref = torch.autograd.grad([o_ref, ht_ref], x.tensors(), [do, dht])
    assert rel_l2(o, o_ref) <= TOL and rel_l2(ht, ht_ref) <= TOL
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, grads_ref, strict=True):
        assert rel_l2(a, b) <= TOL, name
    assert stats.forward_hops == shards - 1


def test_emulated_layer_equals_layer_with_padding() -> None:
    cfg = GDNLayerConfig(hidden_size=32, num_qk_heads=2, num_v_heads=4, head_dim=8)
    layer = gdn_layer_init_(GatedDeltaNet(cfg), 5).double()
    x = torch.randn(2, 160, 32, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 160, dtype=torch.float64)
    mask[1, 151:] = 0
    dy = torch.randn(2, 160, 32, dtype=torch.float64)
    params = [x, *layer.parameters()]
    y = emulated_p2p_layer(layer, x, mask, num_shards=4)
    grads = torch.autograd.grad(y, params, dy)
    y_ref = layer(x, mask)
    grads_ref = torch.autograd.grad(y_ref, params, dy)
    assert rel_l2(y, y_ref) <= TOL
    assert torch.equal(y[1, 151:], torch.zeros_like(y[1, 151:]))
    for a, b in zip(grads, grads_ref, strict=True):
        assert rel_l2(a, b) <= TOL


# (lengths, shards, hops): a sequence across one boundary and through a whole middle shard (P = 4:
# shard 2 is one sequence's middle, shard 1 ends one and starts the next), across several at P = 8,
# and a packing whose every shard boundary is a sequence boundary (each shard alone: no hop)
PACKINGS = [((1, 63, 65, 31), 4, 3), ((5, 20, 120, 15), 8, 7), ((40, 20, 20, 40, 40), 4, 0)]


@pytest.mark.parametrize(("lens", "shards", "hops"), PACKINGS)
def test_emulated_layer_equals_the_packed_layer(lens: tuple[int, ...], shards: int, hops: int) -> None:
    cfg = GDNLayerConfig(hidden_size=32, num_qk_heads=2, num_v_heads=4, head_dim=8)
    layer = gdn_layer_init_(GatedDeltaNet(cfg), 5).double()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, sum(lens), 32, dtype=torch.float64, generator=gen).requires_grad_(True)
    dy = torch.randn(1, sum(lens), 32, dtype=torch.float64, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    params = [x, *layer.parameters()]
    stats = EmulationStats()
    y = emulated_p2p_layer(layer, x, num_shards=shards, stats=stats, cu_seqlens=cu)
    grads = torch.autograd.grad(y, params, dy)
    y_ref = layer(x, cu_seqlens=cu)
    grads_ref = torch.autograd.grad(y_ref, params, dy)
    assert rel_l2(y, y_ref) <= TOL
    for a, b in zip(grads, grads_ref, strict=True):
        assert rel_l2(a, b) <= TOL
    assert stats.forward_hops == hops
    # the packing is honoured: the same tokens as one sequence give another output
    assert rel_l2(emulated_p2p_layer(layer, x, num_shards=shards), y_ref) > 1e-3


def test_emulated_layer_rejects_shards_shorter_than_halo() -> None:
    cfg = GDNLayerConfig(hidden_size=16, num_qk_heads=1, num_v_heads=1, head_dim=8)
    layer = GatedDeltaNet(cfg)
    with pytest.raises(CPError, match="local sequence length 2 is shorter than the Conv1D halo 3"):
        emulated_p2p_layer(layer, torch.randn(1, 8, 16), num_shards=4)
    with pytest.raises(CPError, match="not divisible by the CP size 3"):
        emulated_p2p_layer(layer, torch.randn(1, 8, 16), num_shards=3)
