"""Packed sequences (`cu_seqlens`) through the Triton kernels against the per-sequence fp64 oracle
(CPU interpreter, fp32): lengths 1, 63, 64, 65 and an empty one, so boundaries fall inside chunks,
on them and between two; every sequence with its own initial and final state."""

from __future__ import annotations

import pytest
import torch

from gdn import recurrent_gated_delta_rule
from gdn.ops import triton_interpreter_on
from tests.support.gdn_inputs import make_inputs, rel_l2

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not triton_interpreter_on(),
    reason="interpreter tests run on machines without a GPU (TRITON_INTERPRET=1)",
)

LENGTHS = [1, 63, 0, 64, 65]
HQ, HV, D = 1, 2, 128


@pytest.mark.slow  # every packed layout under the interpreter (gdn/test_varlen.py: the fast tier's)
def test_packed_sequences_match_each_sequence_alone() -> None:
    from kernels.gdn import gated_delta_rule_triton_varlen

    total, n = sum(LENGTHS), len(LENGTHS)
    x = make_inputs(1, total, HQ, HV, D, dtype=torch.float64, stateful=False, seed=21)
    gen = torch.Generator().manual_seed(22)
    h0 = torch.randn(n, HV, D, D, generator=gen, dtype=torch.float64) * 0.1
    do = torch.randn(1, total, HV, D, generator=gen, dtype=torch.float64)
    dht = torch.randn(n, HV, D, D, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])

    leaves = {n_: getattr(x, n_).detach() for n_ in ("q", "k", "v", "g", "beta")}
    mine = {n_: t.float().requires_grad_() for n_, t in leaves.items()}
    mine["h0"] = h0.float().requires_grad_()
    o, ht = gated_delta_rule_triton_varlen(
        mine["q"], mine["k"], mine["v"], mine["g"], mine["beta"],
        cu_seqlens=cu, initial_state=mine["h0"], output_final_state=True,
    )  # fmt: skip
    assert o.shape == (1, total, HV, D) and ht.shape == (n, HV, D, D)
    torch.autograd.backward([o, ht], [do.float(), dht.float()])

    ref = {n_: t.clone().requires_grad_() for n_, t in leaves.items()}
    ref["h0"] = h0.clone().requires_grad_()
    outs, finals = [], []
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        if a == b:
            outs.append(ref["v"][:, a:b] * 0)
            finals.append(ref["h0"][i : i + 1])
            continue
        oi, hi = recurrent_gated_delta_rule(
            ref["q"][:, a:b], ref["k"][:, a:b], ref["v"][:, a:b], ref["g"][:, a:b], ref["beta"][:, a:b],
            initial_state=ref["h0"][i : i + 1], output_final_state=True,
        )  # fmt: skip
        outs.append(oi)
        finals.append(hi)
    o_ref, ht_ref = torch.cat(outs, 1), torch.cat(finals, 0)
    torch.autograd.backward([o_ref, ht_ref], [do, dht])

    assert rel_l2(o, o_ref) <= 2e-5 and rel_l2(ht, ht_ref) <= 2e-5
    assert torch.equal(ht[2], mine["h0"][2].detach())  # the empty sequence passes its state on
    for name in ("q", "k", "v", "g", "beta", "h0"):
        err = rel_l2(mine[name].grad, ref[name].grad)
        assert err <= 2e-5, f"d{name}: {err:.2e}"


def test_bad_offsets_are_refused() -> None:
    from kernels.gdn import gated_delta_rule_triton_varlen

    x = make_inputs(1, 8, HQ, HV, D, dtype=torch.float32, stateful=False, seed=1)
    args = (x.q, x.k, x.v, x.g, x.beta)
    with pytest.raises(ValueError, match="rise from 0 to T=8"):
        gated_delta_rule_triton_varlen(*args, cu_seqlens=torch.tensor([0, 5, 3, 8]))
    with pytest.raises(ValueError, match="1-D integer"):
        gated_delta_rule_triton_varlen(*args, cu_seqlens=torch.tensor([0.0, 8.0]))
    with pytest.raises(ValueError, match="initial_state must be"):
        gated_delta_rule_triton_varlen(*args, cu_seqlens=torch.tensor([0, 8]),
                                       initial_state=torch.zeros(2, HV, D, D))  # fmt: skip
