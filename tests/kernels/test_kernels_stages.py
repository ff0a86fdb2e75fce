"""Each Triton stage of `kernels.gdn` against a torch reference of that stage alone (CPU interpreter).

The end-to-end tests (tests/kernels/test_kernels_interpret.py) would catch a wrong stage only through the
whole chain; here every stage gets its own inputs and its own fp64 reference: the forward stages
from the chunk algebra written out in torch, the backward stages from torch autograd of the
forward expressions they differentiate (with the stage's other inputs held constant). fp32 inputs,
T = 130 (two full chunks and a 2-row one), grouped heads Hqk = 1, Hv = 2; the sequence-parallel
state passes are checked at several forced segment counts.
"""

from __future__ import annotations

import pytest
import torch

from gdn.ops import triton_interpreter_on
from tests.support.gdn_inputs import make_inputs, rel_l2

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not triton_interpreter_on(),
    reason="interpreter tests run on machines without a GPU (TRITON_INTERPRET=1)",
)

T, HQ, HV, D, BT = 130, 1, 2, 128, 64
R = HV // HQ
SCALE = D**-0.5
TOL = 1e-4  # fp32 arithmetic in the interpreter: measured ~1e-6


def chunks() -> list[slice]:
    return [slice(c, min(c + BT, T)) for c in range(0, T, BT)]


def slot_rows(dkp: torch.Tensor) -> torch.Tensor:
    """The dk partial's rows [Hv, T, D] from its chunk slots [Hv, NT, SLOT] (`dqk.dqk_buffers`)."""
    return dkp[:, :, : BT * D].reshape(HV, -1, D)[:, :T]


def in_slots(rows: torch.Tensor) -> torch.Tensor:
    """Rows [Hv, T, D] laid out in chunk slots [Hv, NT, BT·D], as bwd_wy reads the dk partial."""
    out = torch.zeros(HV, len(chunks()) * BT, D, dtype=rows.dtype)
    out[:, :T] = rows
    return out.view(HV, len(chunks()), BT * D)


@pytest.fixture(scope="module")
def x() -> dict[str, torch.Tensor]:
    """fp32 stage inputs and their fp64 copies (suffix 64), head-major where the stages are."""
    base = make_inputs(1, T, HQ, HV, D, dtype=torch.float64, stateful=True, seed=11)
    gen = torch.Generator().manual_seed(12)
    out = {n: getattr(base, n).float().contiguous() for n in ("q", "k", "v", "g", "beta", "h0")}
    out["do"] = torch.randn(1, T, HV, D, generator=gen)
    out["dht"] = torch.randn(1, HV, D, D, generator=gen)
    return out


def head(t: torch.Tensor, h: int) -> torch.Tensor:
    """[1, T, H, D] -> [T, D] fp64 of head h (q/k heads serve value head h as h // R)."""
    return t[0, :, h].double()


def ref_gamma(g: torch.Tensor) -> torch.Tensor:
    out = torch.empty(HV, T, dtype=torch.float64)
    for sl in chunks():
        out[:, sl] = g[0, sl].double().T.cumsum(1)
    return out


def ref_wy(k: torch.Tensor, v: torch.Tensor | None, beta: torch.Tensor, gam: torch.Tensor):
    """Per chunk T = (I + A)⁻¹, Wk = T·diag(β e^γ)·K, U = T·diag(β)·V (torch, differentiable)."""
    ts, ws, us = [], [], []
    for sl in chunks():
        kc, bc, gc = k[sl], beta[sl], gam[sl]
        n = kc.shape[0]
        low = torch.tril(torch.ones(n, n, dtype=torch.bool), -1)
        a = torch.where(low, bc[:, None] * (kc @ kc.T) * torch.exp(gc[:, None] - gc[None, :]), 0.0)
        tm = torch.linalg.inv(torch.eye(n, dtype=kc.dtype) + a)
        ts.append(tm)
        ws.append(tm @ (kc * (bc * torch.exp(gc))[:, None]))
        us.append(tm @ (v[sl] * bc[:, None]) if v is not None else None)
    return ts, ws, us


def ref_state_forward(k, w, u, gam, h0):
    """Per-chunk incoming S, Vn and the final state of one value head (fp64)."""
    S, states, vns = h0.clone(), [], []
    for i, sl in enumerate(chunks()):
        states.append(S)
        vn = u[i] - w[i] @ S
        vns.append(vn)
        gl = gam[sl][-1]
        S = torch.exp(gl) * S + (k[sl] * torch.exp(gl - gam[sl])[:, None]).T @ vn
    return states, vns, S


def attn(q, k, gam):
    """(Q·Kᵀ ⊙ e^{γ_i−γ_j}) on j <= i of one chunk."""
    n = q.shape[0]
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
    return torch.where(causal, (q @ k.T) * torch.exp(gam[:, None] - gam[None, :]), 0.0)


@pytest.fixture(scope="module")
def ref(x) -> dict[str, list]:
    """Reference intermediates per value head, computed once."""
    gam = ref_gamma(x["g"])
    out: dict[str, list] = {"gam": gam, "wy": [], "fwd": []}
    for h in range(HV):
        k, v, b = head(x["k"], h // R), head(x["v"], h), x["beta"][0, :, h].double()
        out["wy"].append(ref_wy(k, v, b, gam[h]))
        _, w, u = out["wy"][h]
        out["fwd"].append(ref_state_forward(k, w, u, gam[h], x["h0"][0, h].double()))
    return out


def test_gate_cumsum(x, ref) -> None:
    from kernels.gdn import gate_cumsum

    assert rel_l2(gate_cumsum(x["g"]), ref["gam"]) <= TOL


def test_intra_solve(x, ref) -> None:
    from kernels.gdn import intra_solve

    gamma = ref["gam"].float()
    w, u, tm = intra_solve(x["k"], x["v"], x["beta"], gamma, HV, store_t=True)
    for h in range(HV):
        ts, ws, us = ref["wy"][h]
        for i, sl in enumerate(chunks()):
            n = sl.stop - sl.start
            assert rel_l2(tm[h, sl, :n], ts[i]) <= TOL
            if n < BT:  # the short chunk's columns past its rows are zero
                assert tm[h, sl, n:].abs().max() == 0
            assert rel_l2(w[h, sl], ws[i]) <= TOL and rel_l2(u[h, sl], us[i]) <= TOL
    w0, u0, _ = intra_solve(x["k"], None, x["beta"], gamma, HV)
    assert u0 is None and torch.equal(w0, w)


@pytest.mark.parametrize("segments", [1, 2, 3])
def test_state_forward(x, ref, segments: int) -> None:
    from kernels.gdn import config_overrides, intra_solve, state_forward

    gamma = ref["gam"].float()
    w, u, _ = intra_solve(x["k"], x["v"], x["beta"], gamma, HV)
    with config_overrides(seq_segments=segments):
        s, vn, ht, maps = state_forward(x["k"], w, u, gamma, HV, x["h0"], store_states=True,
                                        store_vn=True, store_final=True, keep_maps=True)
    assert (maps is None) == (segments == 1)
    for h in range(HV):
        states, vns, final = ref["fwd"][h]
        for i, sl in enumerate(chunks()):
            assert rel_l2(s[h, i], states[i]) <= TOL and rel_l2(vn[h, sl], vns[i]) <= TOL
        assert rel_l2(ht[0, h], final) <= TOL


def test_segment_maps_compose(x, ref) -> None:
    """Each segment's (M, E): S_out = M·S_in + E for its chunks, and the scan gives the states."""
    from kernels.gdn import intra_solve, segment_forward_summary, segment_scan

    gamma = ref["gam"].float()
    w, u, _ = intra_solve(x["k"], x["v"], x["beta"], gamma, HV)
    mm, ee = segment_forward_summary(x["k"], w, u, gamma, HV, 3, with_last=True)
    xs = segment_scan(mm, ee, x["h0"].reshape(HV, D, D), reverse=False)
    for h in range(HV):
        states, _, final = ref["fwd"][h]
        bounds = [*states, final]
        for j in range(3):  # one chunk per segment
            assert rel_l2(mm[h, j].double() @ bounds[j] + ee[h, j], bounds[j + 1]) <= TOL
            assert rel_l2(xs[h, j], bounds[j]) <= TOL


def test_output(x, ref) -> None:
    from kernels.gdn import output

    s = torch.stack([torch.stack(ref["fwd"][h][0]) for h in range(HV)]).float()
    vn = torch.stack([torch.cat(ref["fwd"][h][1]) for h in range(HV)]).float()
    o = output(x["q"], x["k"], vn, s, ref["gam"].float(), HV, SCALE, torch.float32)
    for h in range(HV):
        q, k, gam = head(x["q"], h // R), head(x["k"], h // R), ref["gam"][h]
        for i, sl in enumerate(chunks()):
            want = SCALE * (torch.exp(gam[sl])[:, None] * (q[sl] @ s[h, i].double())
                            + attn(q[sl], k[sl], gam[sl]) @ vn[h, sl].double())
            assert rel_l2(o[0, sl, h], want) <= TOL


def test_dvn_local(x, ref) -> None:
    from kernels.gdn import dvn_local

    dvl = dvn_local(x["q"], x["k"], x["do"], ref["gam"].float(), SCALE)
    for h in range(HV):
        q, k, gam = head(x["q"], h // R), head(x["k"], h // R), ref["gam"][h]
        for sl in chunks():
            want = SCALE * attn(q[sl], k[sl], gam[sl]).T @ head(x["do"], h)[sl]
            assert rel_l2(dvl[h, sl], want) <= TOL


def _ref_state_backward(x, ref, h: int):
    q, k, gam = head(x["q"], h // R), head(x["k"], h // R), ref["gam"][h]
    w = ref["wy"][h][1]
    do = head(x["do"], h)
    dS, dss, dvns = x["dht"][0, h].double(), [None] * len(chunks()), [None] * len(chunks())
    for i in reversed(range(len(chunks()))):
        sl = chunks()[i]
        dss[i] = dS
        gl = gam[sl][-1]
        dvn = SCALE * attn(q[sl], k[sl], gam[sl]).T @ do[sl] + (k[sl] * torch.exp(gl - gam[sl])[:, None]) @ dS
        dvns[i] = dvn
        dS = torch.exp(gl) * dS + SCALE * (q[sl] * torch.exp(gam[sl])[:, None]).T @ do[sl] - w[i].T @ dvn
    return dss, dvns, dS


@pytest.mark.parametrize("segments", [1, 3])
def test_state_backward(x, ref, segments: int) -> None:
    from kernels.gdn import config_overrides, intra_solve, state_backward, state_forward

    gamma = ref["gam"].float()
    w, u, _ = intra_solve(x["k"], x["v"], x["beta"], gamma, HV)
    with config_overrides(seq_segments=segments):
        *_, maps = state_forward(x["k"], w, u, gamma, HV, x["h0"], store_states=False, store_vn=False,
                                 store_final=False, keep_maps=True)
        ds, dvn, dh0 = state_backward(x["q"], x["k"], w, x["do"], gamma, x["dht"], SCALE, want_dh0=True,
                                      maps=maps)
    for h in range(HV):
        dss, dvns, d0 = _ref_state_backward(x, ref, h)
        for i, sl in enumerate(chunks()):
            assert rel_l2(ds[h, i], dss[i]) <= TOL and rel_l2(dvn[h, sl], dvns[i]) <= TOL
        assert rel_l2(dh0[0, h], d0) <= TOL


@pytest.mark.parametrize("bk", [64, 128], ids=lambda bk: f"dqk_bk{bk}")
def test_bwd_dqk(x, ref, bk: int) -> None:
    """dq, the state/output part of dk and Σ dγ partials are the gradients of
    <O, dO> + <S', dS'> in q, k and γ with S, Vn, dS' held (dq summed over a q/k head's value
    heads, the dk partial per value head); dWk = −dVn·Sᵀ. In two key slices, and in one, where
    the dk partial is written over dS' and dWk over Vn (fp32 dWk, fp32 Vn): those are the
    inputs' own tensors afterwards, and S holds dq's carry."""
    from kernels.gdn import bwd_dqk, config_overrides

    gamma = ref["gam"].float()
    s = torch.stack([torch.stack(ref["fwd"][h][0]) for h in range(HV)]).float()
    vn = torch.stack([torch.cat(ref["fwd"][h][1]) for h in range(HV)]).float()
    back = [_ref_state_backward(x, ref, h) for h in range(HV)]
    ds = torch.stack([torch.stack(back[h][0]) for h in range(HV)]).float()
    dvn = torch.stack([torch.cat(back[h][1]) for h in range(HV)]).float()
    s_in, ds_in, vn_in = s.clone(), ds.clone(), vn.clone()
    with config_overrides(dqk_bk=bk, bwd_in_place=True):
        dq, dkp, dw, dgam = bwd_dqk(x["q"], x["k"], HV, gamma, s_in, ds_in, vn_in, dvn, x["do"], SCALE)
    in_place = bk == D
    assert (dkp.untyped_storage().data_ptr() == ds_in.untyped_storage().data_ptr()) == in_place
    assert (dw.data_ptr() == vn_in.data_ptr()) == in_place
    assert not torch.equal(s_in, s)  # the first head's dq carry
    dkp = slot_rows(dkp)
    want_dq = torch.zeros(dq.shape, dtype=torch.float64)
    for h in range(HV):
        q = head(x["q"], h // R).requires_grad_()
        k = head(x["k"], h // R).requires_grad_()
        gam = ref["gam"][h].clone().requires_grad_()
        loss = 0.0
        for i, sl in enumerate(chunks()):
            S, V, dS = s[h, i].double(), vn[h, sl].double(), ds[h, i].double()
            o = SCALE * (torch.exp(gam[sl])[:, None] * (q[sl] @ S) + attn(q[sl], k[sl], gam[sl]) @ V)
            gl = gam[sl][-1]
            s_out = torch.exp(gl) * S + (k[sl] * torch.exp(gl - gam[sl])[:, None]).T @ V
            loss = loss + (o * head(x["do"], h)[sl]).sum() + (s_out * dS).sum()
        gq, gk, gg = torch.autograd.grad(loss, (q, k, gam))
        want_dq[0, :, h // R] += gq
        assert rel_l2(dkp[h], gk) <= TOL
        assert rel_l2(dgam[:, h].sum(0), gg) <= TOL
        for i, sl in enumerate(chunks()):
            assert rel_l2(dw[h, sl], -dvn[h, sl].double() @ s[h, i].double().T) <= TOL
    assert rel_l2(dq, want_dq) <= TOL


def test_bwd_wy(x, ref) -> None:
    """dk, dv, dβ and dg are the gradients of <Wk, dWk> + <U, dU> through the WY representation,
    dk plus the dk partial and summed over a q/k head's value heads, and dg the in-chunk reverse
    cumsum of dγ (with the dγ partials)."""
    from kernels.gdn import bwd_wy, intra_solve

    gen = torch.Generator().manual_seed(13)
    gamma = ref["gam"].float()
    _, _, tm = intra_solve(x["k"], x["v"], x["beta"], gamma, HV, store_t=True)
    dw, du, dkp = (torch.randn(HV, T, D, generator=gen) for _ in range(3))
    dgam = torch.randn(1, HV, T, generator=gen)
    dkp_slots = in_slots(dkp)
    dk, dv, dbeta, dg = bwd_wy(x["k"], x["v"], x["beta"], torch.float32, gamma, tm, dw, du, dkp_slots, dgam)
    want_dk = torch.zeros(dk.shape, dtype=torch.float64)
    for h in range(HV):
        k = head(x["k"], h // R).requires_grad_()
        v = head(x["v"], h).requires_grad_()
        b = x["beta"][0, :, h].double().requires_grad_()
        gam = ref["gam"][h].clone().requires_grad_()
        _, ws, us = ref_wy(k, v, b, gam)
        loss = sum((ws[i] * dw[h, sl]).sum() + (us[i] * du[h, sl]).sum() for i, sl in enumerate(chunks()))
        gk, gv, gb, gg = torch.autograd.grad(loss, (k, v, b, gam))
        want_dk[0, :, h // R] += gk + dkp[h]
        assert rel_l2(dv[0, :, h], gv) <= TOL and rel_l2(dbeta[0, :, h], gb) <= TOL
        dgt = gg + dgam[0, h]
        want = torch.cat([dgt[sl].flip(0).cumsum(0).flip(0) for sl in chunks()])
        assert rel_l2(dg[0, :, h], want) <= TOL
    assert rel_l2(dk, want_dk) <= TOL


@pytest.mark.slow  # the whole op twice under the interpreter
def test_end_to_end_split_matches_the_unsplit_op(x) -> None:
    """The whole op with its state passes split in 3 segments (whose backward reuses the forward's
    segment maps) equals the one-walk op (o, final state, every gradient) up to fp32 rounding; a
    forward without autograd gives the same o and final state."""
    from gdn import gated_delta_rule
    from kernels.gdn import config_overrides

    results = []
    for segments in (1, 3):
        with config_overrides(seq_segments=segments):
            y = {n: x[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta", "h0")}
            o, s = gated_delta_rule(y["q"], y["k"], y["v"], y["g"], y["beta"], initial_state=y["h0"],
                                    output_final_state=True, backend="triton")
            torch.autograd.backward([o, s], [x["do"], x["dht"]])
        results.append({"o": o, "s": s, **{f"d{n}": y[n].grad for n in y}})
    with torch.no_grad(), config_overrides(seq_segments=3):
        o, s = gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                output_final_state=True, backend="triton")
    for name, want in results[0].items():
        assert rel_l2(results[1][name], want) <= 1e-5, name
    assert rel_l2(o, results[0]["o"]) <= 1e-5 and rel_l2(s, results[0]["s"]) <= 1e-5


def test_intra_solve_low_wu_products_round_t_only(x, ref) -> None:
    """fp16 inputs: with f32_dot_wu = "low" (T·diag rounded to fp16 times the exact K or V tile)
    Wk and U stay within a few fp16 roundings of the fp32 products of the same T, and differ from
    them (the setting reaches the kernel)."""
    from kernels.gdn import config_overrides, intra_solve

    gamma = ref["gam"].float()
    k, v, beta = x["k"].half(), x["v"].half(), x["beta"].half()
    out = {}
    for prec in ("ieee", "low"):
        with config_overrides(f32_dot_wu=prec):
            out[prec] = intra_solve(k, v, beta, gamma, HV)[:2]
    err = max(rel_l2(a.double(), b.double()) for a, b in zip(out["low"], out["ieee"], strict=True))
    assert 0 < err <= 1e-3, err  # measured 3.2e-4


def test_intra_solve_column_split_is_exact_and_checked(x, ref) -> None:
    """Wk and U do not depend on how their columns are split over programs (intra_wu_bd: two
    products of 64 columns per program at 128, one at 64 or 32): bit for bit where the products
    keep their 64-column width; at 32 columns within fp32 rounding, since the interpreter hands
    each product to numpy, whose BLAS may sum a narrower product in another order (rel-L2 1.7e-8
    with OpenBLAS 0.3.31 on an AVX-512 CPU). A split that does not divide D is refused with its
    value."""
    from kernels.gdn import config_overrides, intra_solve

    gamma = ref["gam"].float()
    base = intra_solve(x["k"], x["v"], x["beta"], gamma, HV)[:2]
    with config_overrides(intra_wu_bd=64):
        got = intra_solve(x["k"], x["v"], x["beta"], gamma, HV)[:2]
    assert all(torch.equal(a, b) for a, b in zip(got, base, strict=True))
    with config_overrides(intra_wu_bd=32):
        got = intra_solve(x["k"], x["v"], x["beta"], gamma, HV)[:2]
    assert all(rel_l2(a, b) <= 1e-6 for a, b in zip(got, base, strict=True))  # fp32 eps 1.2e-7
    refused = pytest.raises(ValueError, match="intra_wu_bd = 48")
    with config_overrides(intra_wu_bd=48), refused:
        intra_solve(x["k"], x["v"], x["beta"], gamma, HV)


def test_t_fp16_keeps_t_rounded_and_leaves_the_low_wy_backward_unchanged(x, ref) -> None:
    """fp16 inputs: with t_fp16, T is kept as the fp16 rounding of the fp32 T (half the bytes); Wk
    and U scale that rounded T (within a few fp16 roundings of the fp32-T ones); the WY
    backward's "low" products round T to fp16 anyway, so its gradients are bitwise those of the
    fp32 T. bf16 inputs keep T in fp16 too, fp32 inputs in fp32."""
    from kernels.gdn import bwd_wy, config_overrides, intra_solve, kernel_config, t_dtype

    gen = torch.Generator().manual_seed(14)
    gamma = ref["gam"].float()
    k, v, beta = x["k"].half(), x["v"].half(), x["beta"].half()
    dw, du = (torch.randn(HV, T, D, generator=gen).half() for _ in range(2))
    dkp = torch.randn(HV, T, D, generator=gen)
    dgam = torch.randn(1, HV, T, generator=gen)
    out = {}
    for fp16 in (False, True):
        with config_overrides(t_fp16=fp16):
            w, u, tm = intra_solve(k, v, beta, gamma, HV, store_t=True)
            grads = bwd_wy(k, v, beta, torch.float32, gamma, tm, dw, du, in_slots(dkp), dgam)
        out[fp16] = (w, u, tm, grads)
    assert out[False][2].dtype == torch.float32 and out[True][2].dtype == torch.float16
    assert torch.equal(out[True][2], out[False][2].half())
    err = max(rel_l2(out[True][i].double(), out[False][i].double()) for i in (0, 1))
    assert err <= 1e-3, err
    for got, want in zip(out[True][3], out[False][3], strict=True):
        assert torch.equal(got, want)
    assert t_dtype(kernel_config(torch.bfloat16), torch.bfloat16) == torch.float16
    assert intra_solve(x["k"], x["v"], x["beta"], gamma, HV, store_t=True)[2].dtype == torch.float32
