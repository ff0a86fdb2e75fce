"""The chunked eager backend against the per-token oracle, in fp64, values and all gradients."""

from __future__ import annotations

import pytest
import torch

from gdn import chunk_gated_delta_rule_eager, gated_delta_rule, recurrent_gated_delta_rule
from tests.support.gdn_inputs import make_inputs, rel_l2

TOL = 1e-10


def _run(fn, inp, *, output_final_state: bool, scale: float | None = None):
    return fn(
        inp.q, inp.k, inp.v, inp.g, inp.beta,
        scale=scale, initial_state=inp.h0, output_final_state=output_final_state,
    )


@pytest.mark.parametrize("seq_len", [1, 63, 64, 65, 300])
@pytest.mark.parametrize("heads", [(1, 1), (2, 4)])
@pytest.mark.parametrize("stateful", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_eager_matches_oracle_values_and_grads(
    seq_len: int, heads: tuple[int, int], stateful: bool, seed: int
):
    hqk, hv = heads
    ref_in = make_inputs(2, seq_len, hqk, hv, 16, stateful=stateful, seed=seed).requires_grad_()
    eag_in = make_inputs(2, seq_len, hqk, hv, 16, stateful=stateful, seed=seed).requires_grad_()
    o_ref, s_ref = _run(recurrent_gated_delta_rule, ref_in, output_final_state=True)
    o_eag, s_eag = _run(gated_delta_rule, eag_in, output_final_state=True)
    assert o_eag.dtype == torch.float64 and s_eag.dtype == torch.float64
    assert rel_l2(o_eag, o_ref) <= TOL
    assert rel_l2(s_eag, s_ref) <= TOL

    gen = torch.Generator().manual_seed(100 + seed)
    d_o = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    d_s = torch.randn(s_ref.shape, generator=gen, dtype=torch.float64)
    torch.autograd.backward([o_ref, s_ref], [d_o, d_s])
    torch.autograd.backward([o_eag, s_eag], [d_o, d_s])
    for name in ("q", "k", "v", "g", "beta", "h0"):
        ref_t, eag_t = getattr(ref_in, name), getattr(eag_in, name)
        if ref_t is None:
            continue
        assert eag_t.grad is not None, f"no gradient for {name}"
        assert torch.isfinite(eag_t.grad).all(), f"non-finite gradient for {name}"
        assert rel_l2(eag_t.grad, ref_t.grad) <= TOL, f"d{name}: {rel_l2(eag_t.grad, ref_t.grad):.2e}"


def test_eager_scale_and_no_final_state():
    inp = make_inputs(1, 70, 2, 2, 8, seed=3)
    o_ref, _ = _run(recurrent_gated_delta_rule, inp, output_final_state=False, scale=0.37)
    o, s = _run(gated_delta_rule, inp, output_final_state=False, scale=0.37)
    assert s is None
    assert rel_l2(o, o_ref) <= TOL


def test_oracle_matches_definition_on_one_token():
    """One token from state S0: S1 = e^g (I - b k k^T) S0 + b k v^T, o = scale S1^T q."""
    inp = make_inputs(1, 1, 1, 1, 4, seed=5)
    q, k, v = inp.q[0, 0, 0], inp.k[0, 0, 0], inp.v[0, 0, 0]
    g, b, s0 = inp.g[0, 0, 0], inp.beta[0, 0, 0], inp.h0[0, 0]
    s1 = g.exp() * (torch.eye(4, dtype=torch.float64) - b * torch.outer(k, k)) @ s0 + b * torch.outer(k, v)
    o, s = _run(recurrent_gated_delta_rule, inp, output_final_state=True, scale=0.5)
    torch.testing.assert_close(s[0, 0], s1, rtol=0, atol=1e-14)
    torch.testing.assert_close(o[0, 0, 0], 0.5 * s1.T @ q, rtol=0, atol=1e-14)


def test_chunk_size_does_not_change_the_result():
    inp = make_inputs(1, 100, 1, 2, 8, seed=7)
    base, s_base = chunk_gated_delta_rule_eager(
        inp.q, inp.k, inp.v, inp.g, inp.beta, initial_state=inp.h0, output_final_state=True
    )
    for chunk in (1, 16, 37, 128):
        o, s = chunk_gated_delta_rule_eager(
            inp.q, inp.k, inp.v, inp.g, inp.beta,
            initial_state=inp.h0, output_final_state=True, chunk_size=chunk,
        )
        assert rel_l2(o, base) <= TOL and rel_l2(s, s_base) <= TOL


def test_grouped_heads_equal_explicit_repeat():
    inp = make_inputs(1, 65, 2, 6, 8, seed=9)
    o, s = _run(gated_delta_rule, inp, output_final_state=True)
    q_rep, k_rep = inp.q.repeat_interleave(3, dim=2), inp.k.repeat_interleave(3, dim=2)
    o_rep, s_rep = gated_delta_rule(
        q_rep, k_rep, inp.v, inp.g, inp.beta, initial_state=inp.h0, output_final_state=True
    )
    assert rel_l2(o, o_rep) <= TOL and rel_l2(s, s_rep) <= TOL


def test_gradcheck_tiny():
    inp = make_inputs(1, 5, 1, 2, 3, seed=11).requires_grad_()

    def fn(q, k, v, g, beta, h0):
        o, s = chunk_gated_delta_rule_eager(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=2
        )
        return o, s

    assert torch.autograd.gradcheck(fn, tuple(inp.tensors()), eps=1e-6, atol=1e-7)


def test_half_precision_inputs_compute_in_fp32():
    inp = make_inputs(1, 80, 1, 1, 16, dtype=torch.float16, seed=13)
    o, s = _run(gated_delta_rule, inp, output_final_state=True)
    assert o.dtype == torch.float16 and s.dtype == torch.float32
    ref = make_inputs(1, 80, 1, 1, 16, seed=13)
    o_ref, s_ref = _run(recurrent_gated_delta_rule, ref, output_final_state=True)
    assert rel_l2(o, o_ref) < 5e-3 and rel_l2(s, s_ref) < 5e-3


def test_fp32_math_holds_inside_a_bf16_autocast_region():
    """The model runs under bf16 autocast; the eager core and the CP chain must still compute in
    fp32 (autocast would turn their `@` into bf16 products: the trajectory reference and the P2P
    state chain both lost precision that way)."""
    from gdn.cp.summary import apply_transition

    inp = make_inputs(1, 130, 2, 4, 32, dtype=torch.bfloat16, seed=21)
    plain = _run(gated_delta_rule, inp, output_final_state=True)
    oracle = _run(recurrent_gated_delta_rule, make_inputs(1, 130, 2, 4, 32, seed=21), output_final_state=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = _run(gated_delta_rule, inp, output_final_state=True)
        m, s, ext = (torch.randn(1, 4, 32, 32, generator=torch.Generator().manual_seed(i)) for i in range(3))
        chained = apply_transition(m, s, ext)
    assert torch.equal(inside[0], plain[0]) and torch.equal(inside[1], plain[1])
    assert rel_l2(inside[1], oracle[1]) < 5e-3
    assert chained.dtype == torch.float32 and torch.allclose(chained, m @ s + ext, rtol=0, atol=1e-5)
