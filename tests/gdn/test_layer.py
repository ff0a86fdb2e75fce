"""GatedDeltaNet layer (no CP): Qwen3.5 layout against a hand-written fp64 reference, padding, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdn import UnsupportedGDNRequest, recurrent_gated_delta_rule
from gdn.layer import GatedDeltaNet, GDNLayerConfig, gdn_layer_init_

CFG = GDNLayerConfig(hidden_size=32, num_qk_heads=2, num_v_heads=4, head_dim=8)


def _layer(cfg: GDNLayerConfig = CFG, seed: int = 0) -> GatedDeltaNet:
    return gdn_layer_init_(GatedDeltaNet(cfg), seed).double()


def _manual(layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
    """The layer written out token by token from the Qwen3.5 description, with the fp64 oracle."""
    c = layer.config
    B, T, _ = x.shape
    D = c.head_dim
    qkv = x @ layer.in_proj_qkv.weight.T
    conv = F.conv1d(qkv.transpose(1, 2), layer.conv1d.weight, padding=c.conv_size - 1, groups=c.conv_dim)
    qkv = F.silu(conv[..., :T]).transpose(1, 2)
    q, k, v = qkv.split([c.key_dim, c.key_dim, c.value_dim], dim=-1)
    q, k = (t.reshape(B, T, c.num_qk_heads, D) for t in (q, k))
    q, k = (t / (t.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() for t in (q, k))  # Qwen's l2norm eps
    beta = torch.sigmoid(x @ layer.in_proj_b.weight.T)
    g = -layer.A_log.exp() * F.softplus(x @ layer.in_proj_a.weight.T + layer.dt_bias)
    o, _ = recurrent_gated_delta_rule(q, k, v.reshape(B, T, c.num_v_heads, D), g, beta)
    z = (x @ layer.in_proj_z.weight.T).reshape(B, T, c.num_v_heads, D)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c.norm_eps) * layer.norm.weight * F.silu(z)
    return o.reshape(B, T, -1) @ layer.out_proj.weight.T


def test_layer_matches_written_out_reference_values_and_grads() -> None:
    layer = _layer()
    x = torch.randn(2, 70, CFG.hidden_size, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 70, CFG.hidden_size, dtype=torch.float64)
    y = layer(x)
    (gx,) = torch.autograd.grad(y, x, dy)
    params = list(layer.parameters())
    gp = torch.autograd.grad(layer(x), params, dy)
    y_ref = _manual(layer, x)
    gx_ref = torch.autograd.grad(y_ref, x, dy)[0]
    gp_ref = torch.autograd.grad(_manual(layer, x), params, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-10, atol=1e-12)
    for (name, _), a, b in zip(layer.named_parameters(), gp, gp_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m, n=name: f"{n}: {m}")


def test_parameter_layout_is_qwen35() -> None:
    layer = GatedDeltaNet(GDNLayerConfig(hidden_size=64, num_qk_heads=2, num_v_heads=4, head_dim=16))
    shapes = {n: tuple(p.shape) for n, p in layer.named_parameters()}
    assert shapes == {
        "in_proj_qkv.weight": (2 * 32 + 64, 64),
        "in_proj_z.weight": (64, 64),
        "in_proj_b.weight": (4, 64),
        "in_proj_a.weight": (4, 64),
        "conv1d.weight": (128, 1, 4),
        "A_log": (4,),
        "dt_bias": (4,),
        "norm.weight": (16,),
        "out_proj.weight": (64, 64),
    }


def test_default_config_is_the_report_shape() -> None:
    c = GDNLayerConfig()
    assert (c.hidden_size, c.num_qk_heads, c.num_v_heads, c.head_dim, c.conv_size) == (2048, 16, 32, 128, 4)


def test_tail_padding_is_inert_and_zero() -> None:
    layer = _layer()
    T, valid = 70, 45
    x = torch.randn(2, T, CFG.hidden_size, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, T, dtype=torch.float64)
    mask[1, valid:] = 0
    y = layer(x, mask)
    assert torch.equal(y[1, valid:], torch.zeros_like(y[1, valid:]))
    # Valid tokens see exactly what an unpadded run of the valid prefix sees.
    y_valid = layer(x[1:, :valid].detach())
    torch.testing.assert_close(y[1:, :valid], y_valid, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y[:1], layer(x[:1].detach()), rtol=1e-12, atol=1e-12)
    y.sum().backward()
    assert torch.equal(x.grad[1, valid:], torch.zeros_like(x.grad[1, valid:]))


def test_padding_in_the_middle_keeps_the_state() -> None:
    """A padded token passes the recurrent state unchanged: g = 0, beta = 0."""
    layer = _layer()
    x = torch.randn(1, 40, CFG.hidden_size, dtype=torch.float64)
    m = torch.ones(1, 40, dtype=torch.bool)
    m[0, 20:23] = False
    _, _, b, a = layer.project(x, None)
    g, beta = layer.gates(b, a, m.to(x.dtype).unsqueeze(-1))
    assert torch.equal(g[0, 20:23], torch.zeros_like(g[0, 20:23]))
    assert torch.equal(beta[0, 20:23], torch.zeros_like(beta[0, 20:23]))
    y = layer(x, m)
    assert torch.equal(y[0, 20:23], torch.zeros_like(y[0, 20:23]))
    assert y[0, 23:].abs().min() > 0


def test_low_precision_keeps_dtype() -> None:
    layer = gdn_layer_init_(GatedDeltaNet(CFG), 0).to(torch.bfloat16)
    x = torch.randn(1, 16, CFG.hidden_size, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()


@pytest.mark.parametrize(
    ("shape", "match"),
    [((2, 10, 31), "hidden=32"), ((10, 32), r"\[B, T_local")],
)
def test_bad_input_shape(shape: tuple[int, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _layer()(torch.randn(*shape, dtype=torch.float64))


def test_mask_wrong_shape_or_values() -> None:
    layer = _layer()
    x = torch.randn(2, 10, CFG.hidden_size, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"mask must be \[B, T_local\]=\[2, 10\].*got shape \(2, 9\)"):
        layer(x, torch.ones(2, 9))
    with pytest.raises(ValueError, match="only 0"):
        layer(x, torch.full((2, 10), 2.0))


def test_bad_config_and_backend() -> None:
    with pytest.raises(ValueError, match="num_v_heads=6 must be a multiple of num_qk_heads=4"):
        GDNLayerConfig(num_qk_heads=4, num_v_heads=6)
    with pytest.raises(UnsupportedGDNRequest, match="backend='auto'"):
        GatedDeltaNet(CFG, backend="auto")
