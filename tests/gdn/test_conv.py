"""The layer's causal depthwise conv: equals torch's conv1d, gradients exact, shards bit-identical."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gdn.conv as conv_mod
from gdn.conv import causal_depthwise_conv1d


def _torch_conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv1d(x.transpose(1, 2), w, groups=w.shape[0]).transpose(1, 2)


@pytest.mark.parametrize("T", [1, 5, 37])
def test_matches_torch_conv1d_in_fp64_values_and_gradients(T: int) -> None:
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(2, T + 3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 1, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, T, 6, generator=gen, dtype=torch.float64)
    got = causal_depthwise_conv1d(x, w)
    ref = _torch_conv(x, w)
    assert got.shape == (2, T, 6)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    g_got = torch.autograd.grad(got, [x, w], dy)
    g_ref = torch.autograd.grad(ref, [x, w], dy)
    for a, b in zip(g_got, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(causal_depthwise_conv1d, (x, w))


def test_sliced_backward_equals_one_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 103, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 1, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(1, 100, 4, generator=gen, dtype=torch.float64)
    whole = [causal_depthwise_conv1d(x, w), *torch.autograd.grad(causal_depthwise_conv1d(x, w), [x, w], dy)]
    monkeypatch.setattr(conv_mod, "_TOKENS_PER_SLICE", 7)
    sliced = [causal_depthwise_conv1d(x, w), *torch.autograd.grad(causal_depthwise_conv1d(x, w), [x, w], dy)]
    for a, b in zip(sliced, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_shards_with_halo_are_bit_identical_to_the_whole_sequence_in_half_precision() -> None:
    gen = torch.Generator().manual_seed(2)
    T, width = 96, 3
    seq = torch.randn(1, T, 8, generator=gen).to(torch.float16)
    w = torch.randn(8, 1, width + 1, generator=gen)
    whole = causal_depthwise_conv1d(torch.cat([seq.new_zeros(1, width, 8), seq], dim=1), w)
    assert whole.dtype == torch.float16
    pieces = []
    for s in range(0, T, 24):
        halo = seq[:, s - width : s] if s else seq.new_zeros(1, width, 8)
        pieces.append(causal_depthwise_conv1d(torch.cat([halo, seq[:, s : s + 24]], 1), w))
    assert torch.equal(torch.cat(pieces, dim=1), whole)


def test_bad_shapes_name_the_expected_layout() -> None:
    with pytest.raises(ValueError, match=r"weight must be \[channels, 1, kernel\]"):
        causal_depthwise_conv1d(torch.zeros(1, 8, 4), torch.zeros(4, 4))
    with pytest.raises(ValueError, match="channels=4"):
        causal_depthwise_conv1d(torch.zeros(1, 8, 5), torch.zeros(4, 1, 4))
    with pytest.raises(ValueError, match="T >= 1"):
        causal_depthwise_conv1d(torch.zeros(1, 3, 4), torch.zeros(4, 1, 4))
