"""The Triton kernels under the CPU interpreter against the fp64 per-token oracle.

The interpreter cannot run bf16 `tl.dot` (Triton issue 11584: it multiplies raw bits), so these
run fp32 and fp16; bf16 is covered by tests/kernels/test_kernels_gpu.py on a GPU. The matrix is pairwise
rather than a full product (every T meets both head layouts, both dtypes and every
initial/final-state combination) to stay inside the CPU time budget.
"""

from __future__ import annotations

import pytest
import torch

from gdn import gated_delta_rule, recurrent_gated_delta_rule
from gdn.ops import triton_interpreter_on
from tests.support.gdn_inputs import make_inputs, rel_l2
from tests.support.program_order import programs_in_reverse_order

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not triton_interpreter_on(),
    reason="interpreter tests run on machines without a GPU (TRITON_INTERPRET=1)",
)

# rel-L2 bounds against fp64: fp32 arithmetic lands near 1e-6, fp16 storage near 6e-4.
TOL = {torch.float32: 2e-5, torch.float16: 3e-3}

CASES = [
    # seq_len, (Hqk, Hv), dtype, has_h0, output_final_state
    (1, (1, 1), torch.float32, True, True),
    (1, (2, 4), torch.float16, False, False),
    (64, (1, 1), torch.float16, True, False),
    (64, (2, 4), torch.float32, False, True),
    (65, (2, 4), torch.float32, True, True),
    (65, (1, 1), torch.float16, False, True),
    (65, (1, 3), torch.float32, True, True),  # a group's middle value head: dq, dk carried in and out
    pytest.param((200, (2, 4), torch.float16, True, True), marks=pytest.mark.slow),  # the longest
    (200, (1, 1), torch.float32, False, False),
]


def _ids(case: tuple) -> str:
    T, (hq, hv), dt, h0, fs = case
    return f"T{T}-h{hq}x{hv}-{str(dt).split('.')[-1]}-{'h0' if h0 else 'noh0'}-{'fs' if fs else 'nofs'}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_triton_matches_oracle_values_and_grads(case: tuple) -> None:
    _check_against_oracle(case)


@pytest.mark.parametrize(
    "over", [{"f32_dot_wu": "tf32"}, {"intra_wu_bd": 64}],
    ids=lambda v: "-".join(f"{k}={n}" for k, n in v.items()),
)
def test_other_wu_settings_match_oracle(over: dict) -> None:
    """The intra solve's Wk/U at the other settings (fp32 products of T; two programs per chunk,
    one product each): the whole op, forward and backward, within the oracle's bound."""
    from kernels.gdn import config_overrides

    with config_overrides(**over):
        _check_against_oracle((65, (2, 4), torch.float16, True, True))


IN_WALK = {"walk_vn": "u", "dvl_in_walk": True}


@pytest.mark.parametrize(
    "case,over",
    [((65, (2, 4), torch.float16, True, True), IN_WALK),
     # two segments: the summary walk forms U too; a group's middle value head
     ((200, (1, 3), torch.float32, True, True), {**IN_WALK, "seq_segments": 2}),
     ((64, (2, 4), torch.float32, False, True), {"walk_vn": "u"}),
     ((65, (1, 1), torch.float32, True, False), {"dvl_in_walk": True}),
     # the reverse walk forms Wk: two segments (the affine pass too), a group's middle value head
     ((200, (1, 3), torch.float32, True, True), {"walk_wk": True, "seq_segments": 2}),
     ((65, (2, 4), torch.float16, True, True), {"walk_wk": True})],
    ids=lambda v: _ids(v) if isinstance(v, tuple) else "-".join(f"{k}={n}" for k, n in v.items()),
)
def test_walks_that_form_u_wk_or_the_local_dvn_match_the_oracle(case: tuple, over: dict) -> None:
    """The forward walk forming U in its step, the reverse walk forming Wk or the intra-chunk dVn:
    within the oracle's bound, and for fp32 inputs the default's bits (the staged path keeps U, Wk
    and dvl in the input dtype, so fp32 loses nothing there and the sums are the same)."""
    from kernels.gdn import config_overrides

    segments = {k: v for k, v in over.items() if k == "seq_segments"}
    with config_overrides(**over):
        got = _check_against_oracle(case)
    if case[2] == torch.float32:
        with config_overrides(**segments):
            default = _check_against_oracle(case)
        for name, t in got.items():
            assert torch.equal(t, default[name]), f"{name} differs from the default path's"


@pytest.mark.parametrize(
    "case,over",
    [((65, (2, 4), torch.float16, True, True), {"walk_vn": "t"}),
     # split: the summary walks form Vn from T (E with V, M without); the local dVn in the walk
     ((200, (1, 3), torch.float32, True, True), {"walk_vn": "t", "seq_segments": 2, "dvl_in_walk": True}),
     ((1, (1, 1), torch.float32, False, True), {"walk_vn": "t"}),
     # no Wk anywhere: the reverse walk forms it too
     ((65, (2, 4), torch.float16, True, True), {"walk_vn": "t", "walk_wk": True})],
    ids=lambda v: _ids(v) if isinstance(v, tuple) else "-".join(f"{k}={n}" for k, n in v.items()),
)
def test_walk_that_forms_vn_from_t_matches_the_oracle_and_repeats(case: tuple, over: dict) -> None:
    """Vn = T·(β⊙V − βe^γ⊙(K·S)) in the forward walk, no Wk or U written, and the backward's Wk
    formed from the kept T: within the oracle's bound, the same bits twice."""
    from kernels.gdn import config_overrides

    with config_overrides(**over):
        first = _check_against_oracle(case)
        second = _check_against_oracle(case)
    for name, t in first.items():
        assert torch.equal(t, second[name]), f"{name} differs between two runs"


@pytest.mark.parametrize(
    "case,over",
    [((130, (2, 4), torch.float16, True, True), {"dqk_bk": 128}),  # grouped heads: dq's carry in S
     ((200, (1, 3), torch.float16, True, True), {"seq_segments": 2}),  # the affine pass reads dvl
     ((130, (1, 2), torch.float32, True, True), {"dqk_bk": 128})],  # fp32 dS' slots hold the dk partial
    ids=lambda v: _ids(v) if isinstance(v, tuple) else "-".join(f"{k}={n}" for k, n in v.items()),
)
def test_backward_written_in_place_gives_the_same_bits(case: tuple, over: dict) -> None:
    """dVn over dvl, the dk partial over dS' and dWk over Vn (`KernelConfig.bwd_in_place`) change
    where the backward writes, not what: every output bit for bit against fresh buffers. A slot
    or row offset that strayed into a neighbour's unread input would change the sums."""
    from kernels.gdn import config_overrides

    with config_overrides(**over, bwd_in_place=True):
        in_place = _check_against_oracle(case)
    with config_overrides(**over, bwd_in_place=False):
        fresh = _check_against_oracle(case)
    for name, t in in_place.items():
        assert torch.equal(t, fresh[name]), f"{name} differs from the fresh buffers'"


def test_reversed_program_order_runs_every_program_once_last_to_first() -> None:
    """The harness below: each program of a 3x2 launch appends its ids to a log in run order;
    reversed, the log is grid order backwards and every program still sees its own ids."""
    import triton
    import triton.language as tl

    @triton.jit
    def _log_program(log_ptr, step_ptr):
        step = tl.load(step_ptr)
        tl.store(log_ptr + 2 * step, tl.program_id(0))
        tl.store(log_ptr + 2 * step + 1, tl.program_id(1))
        tl.store(step_ptr, step + 1)

    def run() -> list[tuple[int, int]]:
        log, step = torch.full((12,), -1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        _log_program[(3, 2)](log, step)
        return [tuple(p) for p in log.view(6, 2).tolist()]

    in_grid_order = run()
    with programs_in_reverse_order():
        reversed_order = run()
    assert in_grid_order == [(x, y) for x in range(3) for y in range(2)]
    assert reversed_order == in_grid_order[::-1]
    assert run() == in_grid_order  # the builder's own order once the block ends


@pytest.mark.parametrize(
    "case,over",
    [((65, (2, 4), torch.float16, True, True), {}),
     # written over its inputs: grouped heads with dq's carry in S, one key slice
     ((130, (2, 4), torch.float16, True, True), {"dqk_bk": 128, "bwd_in_place": True}),
     # two segments (maps, scan, the affine pass reading dvl), Wk formed in the reverse walk
     ((200, (1, 3), torch.float32, True, True), {"seq_segments": 2, "bwd_in_place": True, "walk_wk": True}),
     # nothing but T kept from the intra stage
     ((65, (2, 4), torch.float16, True, True), {"walk_vn": "t", "walk_wk": True, "bwd_in_place": True}),
     ((65, (2, 4), torch.float16, True, True), {"fused": True})],
    ids=lambda v: _ids(v) if isinstance(v, tuple) else "-".join(f"{k}={n}" for k, n in v.items()) or "dflt",
)
def test_programs_of_a_launch_may_run_in_any_order(case: tuple, over: dict) -> None:
    """Every launch of a fwd+bwd with its programs run last to first gives the bits of grid order:
    no program reads what another program of its launch writes (tests/support/program_order.py),
    the property that writing the backward over its inputs relies on."""
    from kernels.gdn import config_overrides

    with config_overrides(**over):
        in_grid_order = _check_against_oracle(case)
        with programs_in_reverse_order():
            reversed_order = _check_against_oracle(case)
    for name, t in in_grid_order.items():
        assert torch.equal(t, reversed_order[name]), f"{name} depends on the order of a launch's programs"


def test_unknown_walk_vn_is_refused() -> None:
    from kernels.gdn import config_overrides

    expected = "walk_vn = 'x': expected 'load', 'u' or 't'"
    with config_overrides(walk_vn="x"), pytest.raises(ValueError, match=expected):
        _check_against_oracle((1, (1, 1), torch.float32, False, False))


FUSED_CASES = [
    ((65, (2, 4), torch.float16, True, True), {"fused": True}),
    ((1, (1, 1), torch.float32, True, True), {"fused": True}),
    # the backward's step in one part of 128 value and of 128 key columns
    ((200, (1, 1), torch.float32, False, False), {"fused": True, "fused_bv": 64, "fused_bwd_split": 1}),
    # five chunks in 3 segments of groups of 2 (the last one short), a group's middle value head
    ((300, (1, 3), torch.float32, True, True), {"fused": True, "fused_group": 2, "seq_segments": 3}),
    # the backward in value slices of 64 (one value part each): 2 value heads x 2 slices summed in
    # order, key parts of 64; 2 slices, 3 segments, one key part of 128
    ((65, (2, 4), torch.float16, True, True), {"fused": True, "fused_bwd_bv": 64}),
    ((300, (1, 3), torch.float32, True, True),
     {"fused": True, "fused_group": 2, "seq_segments": 3, "fused_bwd_bv": 64, "fused_bwd_split": 1}),
    pytest.param((130, (2, 4), torch.float16, False, True),
                 {"fused": True, "seq_segments": 2, "fused_group": 1, "fused_bv": 64},
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize(
    "case,over", FUSED_CASES,
    ids=lambda v: _ids(v) if isinstance(v, tuple) else "-".join(f"{k}={n}" for k, n in v.items()),
)
def test_fused_path_matches_oracle_and_repeats(case: tuple, over: dict) -> None:
    """The fused forward (Vn on chip from T, whole or sliced value columns) and backward (the
    reverse walk and the WY backward per chunk, groups re-walked from kept states, segments joined
    by exact maps): within the oracle's bound, and a second run gives the same bits."""
    from kernels.gdn import config_overrides

    with config_overrides(**over):
        first = _check_against_oracle(case)
        second = _check_against_oracle(case)
    for name, t in first.items():
        assert torch.equal(t, second[name]), f"{name} differs between two runs"


def test_fused_path_keeps_t_and_group_states_only() -> None:
    """What the fused forward writes for its backward: T and the fp32 state entering every group
    (no Wk, U, per-chunk S or Vn), and the segment maps when split; the launches of one fwd+bwd:
    gate, T's kernel, the fused forward, and one fused backward per value head of a group."""
    from kernels.gdn import config_overrides
    from tests.kernels.test_kernels_varlen import counted_launches

    x = make_inputs(1, 300, 1, 2, 128, dtype=torch.float32, stateful=True, seed=2)
    ins = [t.clone().requires_grad_() for t in x.tensors()]
    with config_overrides(fused=True, fused_group=2), counted_launches() as counts:
        o, s = gated_delta_rule(*ins[:5], initial_state=ins[5], output_final_state=True, backend="triton")
        tm, groups, maps, cps = o.grad_fn.kept
        assert tm.shape == (2, 300, 64) and groups.shape == (2, 3, 128, 128) and maps is None and cps == 6
        assert groups.dtype == torch.float32 and torch.equal(groups[:, 0], ins[5].detach()[0])
        (o.sum() + s.sum()).backward()
    assert dict(counts) == {"_gate_cumsum_kernel": 1, "_intra_t_kernel": 1, "_fused_fwd_kernel": 1,
                            "_fused_bwd_kernel": 2}


def test_fused_path_refuses_packed_sequences() -> None:
    from kernels.gdn import config_overrides, gated_delta_rule_triton_varlen

    x = make_inputs(1, 70, 1, 2, 128, dtype=torch.float32, stateful=False, seed=1)
    with config_overrides(fused=True), pytest.raises(ValueError, match="fused = True takes dense sequences"):
        gated_delta_rule_triton_varlen(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=torch.tensor([0, 5, 70]))
    with config_overrides(fused=True, fused_bv=32), pytest.raises(ValueError, match="fused_bv = 32"):
        gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, backend="triton")


@pytest.mark.parametrize(
    "over,message",
    [pytest.param({"fused_bwd_bv": 32}, r"fused_bwd_bv = 32: expected 64 or 128 .*FUSED_BWD_MIN_PART = 64",
                  id="bv32"),
     pytest.param({"fused_bwd_bv": 16, "fused_bwd_split": 1}, r"fused_bwd_bv = 16: expected 64 or 128",
                  id="bv16-split1"),
     pytest.param({"fused_bwd_split": 4}, r"fused_bwd_split = 4: expected 1 or 2 \(parts of D = 128, at "
                  r"least FUSED_BWD_MIN_PART = 64 columns each\)", id="split4")],
)
def test_fused_backward_refuses_parts_narrower_than_64(over: dict, message: str) -> None:
    """A fused backward whose value or key parts would be narrower than FUSED_BWD_MIN_PART is
    refused before any launch, naming the value and what is expected."""
    from kernels.gdn import config_overrides

    x = make_inputs(1, 70, 1, 1, 128, dtype=torch.float32, stateful=False, seed=1)
    with config_overrides(fused=True, **over), pytest.raises(ValueError, match=message):
        gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, backend="triton")


def test_fused_backward_parts() -> None:
    """The step's part widths (value, key): D in fused_bwd_split parts, a 64-column program's
    value columns in one part whatever the split."""
    from kernels.gdn.config import DEFAULT, FUSED_BWD_MIN_PART, fused_bwd_parts

    assert FUSED_BWD_MIN_PART == 64
    got = {(bv, split): fused_bwd_parts(DEFAULT.replace(fused_bwd_bv=bv, fused_bwd_split=split))
           for bv in (64, 128) for split in (1, 2)}
    assert got == {(64, 1): (64, 128), (64, 2): (64, 64), (128, 1): (128, 128), (128, 2): (64, 64)}


def _check_against_oracle(case: tuple) -> dict[str, torch.Tensor]:
    """o, the final state and every gradient of the triton backend against the fp64 oracle;
    returns them."""
    T, (hq, hv), dtype, has_h0, final = case
    base = make_inputs(1, T, hq, hv, 128, dtype=torch.float64, stateful=has_h0, seed=T + hv)
    ref = make_inputs(1, T, hq, hv, 128, dtype=torch.float64, stateful=has_h0, seed=T + hv).requires_grad_()
    o_ref, s_ref = recurrent_gated_delta_rule(
        ref.q, ref.k, ref.v, ref.g, ref.beta, initial_state=ref.h0, output_final_state=final
    )
    low = {n: getattr(base, n) for n in ("q", "k", "v", "beta")}
    low = {n: t.to(dtype).requires_grad_() for n, t in low.items()}
    g = base.g.float().requires_grad_()
    h0 = base.h0.float().requires_grad_() if has_h0 else None
    o, s = gated_delta_rule(
        low["q"], low["k"], low["v"], g, low["beta"],
        initial_state=h0, output_final_state=final, backend="triton",
    )
    assert o.dtype == dtype and o.shape == o_ref.shape
    assert (s is None) == (not final)
    tol = TOL[dtype]
    assert torch.isfinite(o).all()
    assert rel_l2(o, o_ref) <= tol, f"o: {rel_l2(o, o_ref):.2e}"
    if final:
        assert s.dtype == torch.float32 and rel_l2(s, s_ref) <= tol, f"final state: {rel_l2(s, s_ref):.2e}"

    gen = torch.Generator().manual_seed(7)
    d_o = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    outs_ref, grads = [o_ref], [d_o]
    outs, grads_low = [o], [d_o.to(dtype)]
    if final:
        d_s = torch.randn(s_ref.shape, generator=gen, dtype=torch.float64)
        outs_ref.append(s_ref)
        grads.append(d_s)
        outs.append(s)
        grads_low.append(d_s.float())
    torch.autograd.backward(outs_ref, grads)
    torch.autograd.backward(outs, grads_low)
    mine = {**low, "g": g, "h0": h0}
    for name in ("q", "k", "v", "g", "beta", "h0"):
        ref_t = getattr(ref, name)
        if ref_t is None:
            continue
        got = mine[name].grad
        assert got is not None, f"no gradient for {name}"
        assert got.dtype == mine[name].dtype and got.shape == mine[name].shape
        assert torch.isfinite(got).all(), f"non-finite d{name}"
        if ref_t.grad.norm() == 0:  # e.g. dg at T=1 with no state: nothing depends on g
            assert got.abs().max() == 0, f"d{name} should be exactly zero"
            continue
        err = rel_l2(got, ref_t.grad)
        assert err <= tol, f"d{name}: {err:.2e} > {tol:.0e}"
    grads = {f"d{n}": t.grad for n, t in mine.items() if t is not None}
    return {"o": o, **({"s": s} if final else {}), **grads}


def test_state_summary_composes_to_final_state() -> None:
    """S_end = M·S_in + S_ext with M from (V = 0, S_in = I) and S_ext from S_in = 0."""
    from kernels.gdn import state_summary

    x = make_inputs(1, 130, 2, 4, 128, dtype=torch.float64, stateful=True, seed=5)
    _, s_ref = recurrent_gated_delta_rule(
        x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True
    )
    k, v, beta, g = x.k.float(), x.v.float(), x.beta.float(), x.g.float()
    eye = torch.eye(128).expand(1, 4, 128, 128)
    m = state_summary(k, v, g, beta, initial_state=eye, zero_values=True)
    s_ext = state_summary(k, v, g, beta)
    assert m.shape == (1, 4, 128, 128) and m.dtype == torch.float32
    composed = torch.einsum("bhij,bhjv->bhiv", m.double(), x.h0) + s_ext.double()
    assert rel_l2(composed, s_ref) <= 2e-5
    _, s_ext_ref = recurrent_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, output_final_state=True)
    assert rel_l2(s_ext, s_ext_ref) <= 2e-5


def test_output_only_backward_and_scale() -> None:
    """Backward with dO alone (final state requested but unused) and a non-default scale."""
    x = make_inputs(1, 70, 1, 2, 128, dtype=torch.float64, stateful=True, seed=9)
    ref = make_inputs(1, 70, 1, 2, 128, dtype=torch.float64, stateful=True, seed=9).requires_grad_()
    o_ref, _ = recurrent_gated_delta_rule(
        ref.q, ref.k, ref.v, ref.g, ref.beta, scale=0.3, initial_state=ref.h0, output_final_state=True
    )
    mine = [t.float().requires_grad_() for t in x.tensors()]
    o, s = gated_delta_rule(*mine[:5], scale=0.3, initial_state=mine[5], output_final_state=True,
                            backend="triton")
    assert s is not None
    o_ref.sum().backward()
    o.sum().backward()
    assert rel_l2(o, o_ref) <= 2e-5
    for got, want in zip(mine, ref.tensors(), strict=True):
        assert rel_l2(got.grad, want.grad) <= 2e-5


@pytest.mark.parametrize("over", [{}, {"fused": True}], ids=["staged", "fused"])
def test_second_backward_recomputes_released_intermediates(over: dict) -> None:
    """The first backward frees the forward's kept intermediates; a second one (retain_graph)
    recomputes them and must give the same gradients."""
    from kernels.gdn import config_overrides

    x = make_inputs(1, 70, 1, 2, 128, dtype=torch.float32, stateful=True, seed=3)
    ins = [t.clone().requires_grad_() for t in x.tensors()]
    with config_overrides(**over):
        o, s = gated_delta_rule(*ins[:5], initial_state=ins[5], output_final_state=True, backend="triton")
    loss = o.square().sum() + s.sum()
    first = torch.autograd.grad(loss, ins, retain_graph=True)
    second = torch.autograd.grad(loss, ins)
    for a, b in zip(first, second, strict=True):
        assert torch.isfinite(a).all()
        assert rel_l2(b, a) <= 1e-6


@pytest.mark.parametrize("over", [{}, {"fused": True}], ids=["staged", "fused"])
def test_state_callbacks_get_the_final_state_and_the_initial_state_gradient(over: dict) -> None:
    """The P2P chain's early hand-off points: each callback runs once and sees exactly what the
    call returns (the final state; the initial state's gradient)."""
    from kernels.gdn import config_overrides

    x = make_inputs(1, 100, 1, 2, 128, dtype=torch.float32, stateful=True, seed=11)
    inputs = [t.clone().requires_grad_() for t in x.tensors()]
    seen: list[tuple[str, torch.Tensor]] = []
    with config_overrides(**over):
        o, s = gated_delta_rule(
            *inputs[:5], initial_state=inputs[5], output_final_state=True, backend="triton",
            on_final_state=lambda t: seen.append(("final", t.detach().clone())),
            on_initial_state_grad=lambda t: seen.append(("initial_grad", t.detach().clone())),
        )
    assert [name for name, _ in seen] == ["final"] and torch.equal(seen[0][1], s)
    gen = torch.Generator().manual_seed(3)
    d_o, d_s = torch.randn(o.shape, generator=gen), torch.randn(s.shape, generator=gen)
    torch.autograd.backward([o, s], [d_o, d_s])
    assert [name for name, _ in seen] == ["final", "initial_grad"]
    assert torch.equal(seen[1][1], inputs[5].grad)


@pytest.mark.parametrize("over", [{}, {"fused": True}], ids=["staged", "fused"])
def test_activation_checkpoint_does_not_keep_intermediates(over: dict) -> None:
    """Under a non-reentrant checkpoint the forward keeps nothing on ctx (the checkpoint could not
    free it) and the backward recomputes: gradients bit-identical to the plain run, which keeps."""
    from torch.utils.checkpoint import checkpoint

    from kernels.gdn import config_overrides

    x = make_inputs(1, 100, 1, 2, 128, dtype=torch.float32, stateful=True, seed=13)
    d_o = torch.randn(x.v.shape, generator=torch.Generator().manual_seed(1))
    grads = {}
    for ckpt in (False, True):
        inputs = [t.clone().requires_grad_() for t in x.tensors()]

        def core(*t: torch.Tensor) -> torch.Tensor:
            with config_overrides(**over):  # also for the checkpoint's re-run
                return gated_delta_rule(*t[:5], initial_state=t[5], backend="triton")[0]

        o = checkpoint(core, *inputs, use_reentrant=False) if ckpt else core(*inputs)
        assert (o.grad_fn.kept is None) == ckpt  # the custom Function's node is its ctx
        o.backward(d_o)
        grads[ckpt] = [t.grad for t in inputs]
    for plain, ckpt in zip(grads[False], grads[True], strict=True):
        assert torch.equal(plain, ckpt)
