"""Every unsupported request raises at once, naming the value and what is supported."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import gdn
from gdn import GDNShape, UnsupportedGDNRequest, check_triton_gdn, gated_delta_rule, is_triton_gdn_available
from tests.support.gdn_inputs import make_inputs

PROD = GDNShape(1, 8192, 16, 32, 128, 128)


def _call(inp, **kw):
    return gated_delta_rule(inp.q, inp.k, inp.v, inp.g, inp.beta, initial_state=inp.h0, **kw)


def test_backend_auto_is_refused():
    inp = make_inputs(1, 4, 1, 1, 8)
    with pytest.raises(UnsupportedGDNRequest, match=r"backend='auto' is not supported.*'eager', 'triton'"):
        _call(inp, backend="auto")


def test_unknown_backend_is_refused():
    inp = make_inputs(1, 4, 1, 1, 8)
    with pytest.raises(UnsupportedGDNRequest, match=r"backend='cuda' is not supported"):
        _call(inp, backend="cuda")


def test_triton_head_dim_not_128():
    inp = make_inputs(1, 4, 1, 1, 64, dtype=torch.float32)
    with pytest.raises(UnsupportedGDNRequest, match=r"head_dim \(k=64, v=64\).*only head_dim=128"):
        _call(inp, backend="triton")


def test_triton_chunk_size_not_64():
    inp = make_inputs(1, 4, 1, 1, 128, dtype=torch.float32)
    with pytest.raises(UnsupportedGDNRequest, match=r"chunk_size=32 .*only chunk_size=64"):
        _call(inp, backend="triton", chunk_size=32)


def test_check_names_reason_for_shapes():
    with pytest.raises(UnsupportedGDNRequest, match="chunk_size=128"):
        check_triton_gdn(PROD, chunk_size=128)
    with pytest.raises(UnsupportedGDNRequest, match=r"num_v_heads=30 is not a multiple of num_qk_heads=16"):
        check_triton_gdn((1, 8192, 16, 30, 128, 128), device="cpu")
    with pytest.raises(UnsupportedGDNRequest, match=r"dtype torch\.float64"):
        check_triton_gdn(PROD, dtype=torch.float64)
    assert is_triton_gdn_available(PROD, chunk_size=128) is False


def test_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton not installed: the missing-triton error comes first")
    with pytest.raises(UnsupportedGDNRequest, match=r"needs the Triton interpreter \(TRITON_INTERPRET=1\)"):
        check_triton_gdn(PROD, device="cpu")
    assert is_triton_gdn_available(PROD, device="cpu") is False


def test_triton_missing(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real_find_spec(name, *a)
    )
    with pytest.raises(UnsupportedGDNRequest, match=r"Triton is not installed.*backend='eager'"):
        check_triton_gdn(PROD, device="cpu")


def _three_v_heads_for_two_qk_heads(inp) -> None:
    inp.q, inp.k = inp.q.repeat(1, 1, 2, 1), inp.k.repeat(1, 1, 2, 1)
    inp.v = inp.v[:, :, :1].expand(-1, -1, 3, -1)


@pytest.mark.parametrize(
    ("mutate", "error", "pattern"),
    [
        (lambda i: setattr(i, "k", i.k[:, :, :, :4]), ValueError, r"q and k must have the same shape"),
        (lambda i: setattr(i, "v", i.v[:, :3]), ValueError, r"v must be \[B=1, T=4, Hv, Dv\]"),
        (_three_v_heads_for_two_qk_heads, ValueError, r"Hv=3 must be a multiple of q/k heads Hqk=2"),
        (lambda i: setattr(i, "g", i.g[..., :1]), ValueError, r"g must be \[B, T, Hv\]=\[1, 4, 2\]"),
        (lambda i: setattr(i, "beta", i.beta[0]), ValueError, r"beta must be \[B, T, Hv\]"),
        (lambda i: setattr(i, "h0", i.h0[..., :3]), ValueError, r"initial_state must be \[B, Hv, Dk, Dv\]"),
        (lambda i: setattr(i, "q", i.q.float()), TypeError, r"q, k and v must share one dtype"),
        (lambda i: setattr(i, "q", i.q[0]), ValueError, r"q must be \[B, T, H, D\]"),
        (lambda i: setattr(i, "g", i.g.long()), TypeError, r"g must be a floating-point tensor"),
        (lambda i: setattr(i, "beta", [0.5]), TypeError, r"beta must be a torch.Tensor, got list"),
        (lambda i: setattr(i, "g", i.g.to("meta")), ValueError, r"all tensors must be on one device"),
    ],
)
def test_bad_inputs(mutate, error, pattern):
    inp = make_inputs(1, 4, 1, 2, 8)
    mutate(inp)
    with pytest.raises(error, match=pattern):
        _call(inp)


def test_public_names():
    assert set(gdn.__all__) >= {"gated_delta_rule", "is_triton_gdn_available", "check_triton_gdn"}


def test_state_callbacks_need_triton():
    inp = make_inputs(1, 4, 1, 1, 8)
    with pytest.raises(UnsupportedGDNRequest, match=r"need backend='triton'"):
        _call(inp, backend="eager", on_final_state=lambda t: None)
