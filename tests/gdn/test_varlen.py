"""Packed sequences (`cu_seqlens`) through `gdn.gated_delta_rule`: each backend equals the fp64
per-token oracle run on every sequence alone, outputs, final states and every gradient (the
initial states' too), for lengths 1, 63, 64, 65 and one with a chunk boundary inside (130); bad
offsets are refused naming the value."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from gdn import gated_delta_rule, recurrent_gated_delta_rule
from gdn.ops import triton_interpreter_on
from tests.support.gdn_inputs import make_inputs, rel_l2

LENGTHS = [1, 63, 64, 65, 130]
NAMES = ("q", "k", "v", "g", "beta", "h0")


def _packed(lengths: list[int], hv: int, d: int, seed: int) -> (
    tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor]
):
    total, n = sum(lengths), len(lengths)
    x = make_inputs(1, total, 1, hv, d, dtype=torch.float64, stateful=False, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    leaves = {nm: getattr(x, nm).detach() for nm in NAMES[:5]}
    leaves["h0"] = torch.randn(n, hv, d, d, generator=gen, dtype=torch.float64) * 0.1
    do = torch.randn(1, total, hv, d, generator=gen, dtype=torch.float64)
    dht = torch.randn(n, hv, d, d, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return leaves, do, dht, cu


def _oracle_each_sequence_alone(leaves: dict, do: torch.Tensor, dht: torch.Tensor, cu: torch.Tensor) -> dict:
    ref = {nm: t.clone().requires_grad_() for nm, t in leaves.items()}
    outs, finals = [], []
    bounds = cu.tolist()
    for i, (a, b) in enumerate(pairwise(bounds)):
        o, ht = recurrent_gated_delta_rule(
            *(ref[nm][:, a:b] for nm in NAMES[:5]), initial_state=ref["h0"][i : i + 1],
            output_final_state=True,
        )
        outs.append(o)
        finals.append(ht)
    o, ht = torch.cat(outs, 1), torch.cat(finals, 0)
    torch.autograd.backward([o, ht], [do, dht])
    return {"o": o.detach(), "ht": ht.detach(), **{f"d{nm}": ref[nm].grad for nm in NAMES}}


def _backend(leaves: dict, do: torch.Tensor, dht: torch.Tensor, cu: torch.Tensor, backend: str,
             dtype: torch.dtype) -> dict:
    mine = {nm: t.to(dtype if nm not in ("g", "h0") else torch.float32 if dtype != torch.float64 else dtype)
            .requires_grad_() for nm, t in leaves.items()}
    o, ht = gated_delta_rule(
        *(mine[nm] for nm in NAMES[:5]), initial_state=mine["h0"], output_final_state=True,
        cu_seqlens=cu, backend=backend,
    )
    assert o.shape == leaves["v"].shape and ht.shape == leaves["h0"].shape
    torch.autograd.backward([o, ht], [do.to(o.dtype), dht.to(ht.dtype)])
    return {"o": o.detach(), "ht": ht.detach(), **{f"d{nm}": mine[nm].grad for nm in NAMES}}


def _assert_close(got: dict, ref: dict, tol: float) -> None:
    for name, r in ref.items():
        err = rel_l2(got[name], r)
        assert err <= tol, f"{name}: rel_l2 {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_eager_packed_equals_each_sequence_alone(dtype: torch.dtype, tol: float) -> None:
    leaves, do, dht, cu = _packed(LENGTHS, hv=2, d=8, seed=3)
    ref = _oracle_each_sequence_alone(leaves, do, dht, cu)
    _assert_close(_backend(leaves, do, dht, cu, "eager", dtype), ref, tol)


def test_oracle_packed_is_the_oracle_per_sequence() -> None:
    leaves, do, dht, cu = _packed([1, 64, 65], hv=1, d=4, seed=5)
    o, ht = recurrent_gated_delta_rule(
        *(leaves[nm] for nm in NAMES[:5]), initial_state=leaves["h0"], output_final_state=True, cu_seqlens=cu
    )
    ref = _oracle_each_sequence_alone(leaves, do, dht, cu)
    assert torch.equal(o, ref["o"]) and torch.equal(ht, ref["ht"])
    # and packing is not a no-op: the same tokens as one sequence give another output
    dense, _ = recurrent_gated_delta_rule(*(leaves[nm] for nm in NAMES[:5]), initial_state=leaves["h0"][:1])
    assert rel_l2(dense[:, 1:], o[:, 1:]) > 1e-3


@pytest.mark.skipif(
    torch.cuda.is_available() or not triton_interpreter_on(),
    reason="interpreter tests run on machines without a GPU (TRITON_INTERPRET=1)",
)
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-5), (torch.float16, 5e-3)])
def test_triton_packed_equals_each_sequence_alone(dtype: torch.dtype, tol: float) -> None:
    leaves, do, dht, cu = _packed([1, 64, 65], hv=1, d=128, seed=7)
    ref = _oracle_each_sequence_alone(leaves, do, dht, cu)
    _assert_close(_backend(leaves, do, dht, cu, "triton", dtype), ref, tol)


def _refusal(cu: object, *, batch: int = 1, states: int | None = None, total: int = 8) -> str:
    x = make_inputs(batch, total, 1, 1, 4, dtype=torch.float32, stateful=False, seed=1)
    h0 = None if states is None else torch.zeros(states, 1, 4, 4)
    with pytest.raises((ValueError, TypeError)) as info:
        gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=cu, initial_state=h0)
    return str(info.value)


def test_bad_offsets_are_refused_naming_the_value() -> None:
    assert "strictly increasing" in (m := _refusal(torch.tensor([0, 5, 3, 8]))) and "cu_seqlens[1]=5" in m
    assert "cu_seqlens[1]=4 then cu_seqlens[2]=4" in _refusal(torch.tensor([0, 4, 4, 8]))
    assert "must start at 0, got 2" in _refusal(torch.tensor([2, 5, 8]))
    assert "must end at T=8, got 7" in _refusal(torch.tensor([0, 3, 7]))
    assert "need batch 1" in (m := _refusal(torch.tensor([0, 8]), batch=2)) and "got 2" in m
    assert "1-D integer tensor" in _refusal(torch.tensor([0.0, 8.0]))
    assert "1-D integer tensor" in _refusal(torch.tensor([8]))
    assert "must be a torch.Tensor" in _refusal([0, 8])
    m = _refusal(torch.tensor([0, 3, 8]), states=3)
    assert "[N, Hv, Dk, Dv]=[2, 1, 4, 4]" in m and "got (3, 1, 4, 4)" in m
