"""Triton CP path on one GPU: P2P emulation (P = 4, 8 shards) against no-CP Triton, bf16, 8K-32K.

Bar (docs/cp.md): relative-L2 <= 5e-3 on every tensor, and no growth with P or T (an error at P = 8
or 32K stays within 2x the P = 4 / 8K error, plus a small floor for errors near zero). For the
layer, single parameters whose gradient is a sum over every token with cancellation (A_log,
dt_bias: 32 values each) amplify relative error, so each is held to the report's 1e-2 layer
bound, while all parameter gradients together (`params`) are held to 5e-3 and to no growth.
"""

from __future__ import annotations

import pytest
import torch

from gdn import gated_delta_rule
from gdn.cp import state_summary
from gdn.cp.emulation import emulated_p2p_gated_delta_rule, emulated_p2p_layer
from gdn.layer import GatedDeltaNet, GDNLayerConfig, gdn_layer_init_
from tests.support.gdn_inputs import make_inputs, rel_l2

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
BAR = 5e-3
SEQ_LENS = (8192, 16384, 32768)
SHARDS = (4, 8)
GROWTH, FLOOR = 2.0, 2e-4


def _check_no_growth(
    errs: dict[tuple[int, int], dict[str, float]], loose: tuple[str, ...] = (), loose_bar: float = 1e-2
) -> None:
    base = errs[(SEQ_LENS[0], SHARDS[0])]
    for (T, P), e in errs.items():
        for name, value in e.items():
            bar = loose_bar if name in loose else BAR
            assert value <= bar, f"T={T} P={P} {name}: rel-L2 {value:.3e} > {bar}"
            if name in loose:
                continue
            assert value <= GROWTH * base[name] + FLOOR, (
                f"T={T} P={P} {name}: rel-L2 {value:.3e} grew from {base[name]:.3e} at "
                f"T={SEQ_LENS[0]} P={SHARDS[0]}"
            )


def test_triton_summary_matches_eager_fp32() -> None:
    x = make_inputs(1, 8192, 16, 32, 128, dtype=torch.bfloat16, stateful=False, device="cuda")
    x.requires_grad_()
    m, ext = state_summary(x.q, x.k, x.v, x.g, x.beta, backend="triton")
    dm, de = torch.randn_like(m) / m.numel(), torch.randn_like(ext) / ext.numel()
    leaves = [x.k, x.v, x.g, x.beta]  # final states do not depend on q
    grads = torch.autograd.grad([m, ext], leaves, [dm, de])
    f32 = [t.detach().float().requires_grad_() for t in (x.q, *leaves)]
    m_ref, ext_ref = state_summary(*f32, backend="eager")
    grads_ref = torch.autograd.grad([m_ref, ext_ref], f32[1:], [dm, de])
    assert rel_l2(m, m_ref) <= BAR and rel_l2(ext, ext_ref) <= BAR
    for name, a, b in zip(("dk", "dv", "dg", "dbeta"), grads, grads_ref, strict=True):
        assert rel_l2(a, b) <= BAR, name


def test_emulated_p2p_triton_core_equals_no_cp_triton() -> None:
    errs: dict[tuple[int, int], dict[str, float]] = {}
    names = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta")
    for T in SEQ_LENS:
        x = make_inputs(1, T, 16, 32, 128, dtype=torch.bfloat16, stateful=False, seed=T, device="cuda")
        x.requires_grad_()
        gen = torch.Generator(device="cuda").manual_seed(T)
        do = torch.randn(x.v.shape, device="cuda", generator=gen, dtype=torch.bfloat16)
        dht = torch.randn(1, 32, 128, 128, device="cuda", generator=gen) / (32 * 128 * 128)
        o_ref, ht_ref = gated_delta_rule(
            x.q, x.k, x.v, x.g, x.beta, output_final_state=True, backend="triton"
        )
        ref = [o_ref, ht_ref, *torch.autograd.grad([o_ref, ht_ref], x.tensors(), [do, dht])]
        for P in SHARDS:
            o, ht = emulated_p2p_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, num_shards=P, backend="triton")
            got = [o, ht, *torch.autograd.grad([o, ht], x.tensors(), [do, dht])]
            errs[(T, P)] = {n: rel_l2(a, b) for n, a, b in zip(names, got, ref, strict=True)}
        del ref, got
    print({k: {n: f"{v:.2e}" for n, v in e.items()} for k, e in errs.items()})
    _check_no_growth(errs)


def test_emulated_p2p_triton_layer_equals_no_cp_triton_layer() -> None:
    """The report's layer (hidden 2048, heads 16/32, dim 128) under bf16 autocast, fp32 parameters."""
    layer = gdn_layer_init_(GatedDeltaNet(GDNLayerConfig(), backend="triton"), 0).cuda()
    params = list(layer.parameters())
    errs: dict[tuple[int, int], dict[str, float]] = {}
    for T in SEQ_LENS:
        gen = torch.Generator(device="cuda").manual_seed(T)
        x = torch.randn(1, T, 2048, device="cuda", generator=gen).requires_grad_()
        dy = torch.randn(1, T, 2048, device="cuda", generator=gen) / T**0.5
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y_ref = layer(x)
        ref = [y_ref, *torch.autograd.grad(y_ref, [x, *params], dy.to(y_ref.dtype))]
        for P in SHARDS:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = emulated_p2p_layer(layer, x, num_shards=P)
            got = [y, *torch.autograd.grad(y, [x, *params], dy.to(y.dtype))]
            names = ["output", "input_grad", *(n for n, _ in layer.named_parameters())]
            e = {n: rel_l2(a, b) for n, a, b in zip(names, got, ref, strict=True)}
            e["params"] = rel_l2(
                torch.cat([g.flatten() for g in got[2:]]), torch.cat([g.flatten() for g in ref[2:]])
            )
            errs[(T, P)] = e
        del ref, got
    print({k: {n: f"{v:.2e}" for n, v in e.items()} for k, e in errs.items()})
    _check_no_growth(errs, loose=tuple(n for n, _ in layer.named_parameters()))
