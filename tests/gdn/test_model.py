"""The hybrid model on one process: layout, loss semantics, padding, checkpoint parity, bad inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdn.data import IGNORE_INDEX
from gdn.model import MODEL_CONFIGS, HybridModel, ModelConfig, build_model, model_config
from gdn.parallel import apply_activation_checkpoint, global_grad_norm, named_full_parameters

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_report_configs_are_3_to_1_hybrids() -> None:
    four, eight = MODEL_CONFIGS["qwen35-4l"], MODEL_CONFIGS["qwen35-8l"]
    assert [four.layer_type(i) for i in range(4)] == ["linear_attention"] * 3 + ["full_attention"]
    types8 = [eight.layer_type(i) for i in range(8)]
    assert types8.count("full_attention") == 2 and types8[3] == types8[7] == "full_attention"
    lc = four.layer_config()
    sizes = (lc.hidden_size, lc.num_qk_heads, lc.num_v_heads, lc.head_dim, lc.conv_size)
    assert sizes == (2048, 16, 32, 128, 4)


def test_tiny_model_structure_and_shapes() -> None:
    model = build_model("tiny", seed=0)
    kinds = [type(layer.linear_attn if layer.layer_type == "linear_attention" else layer.self_attn).__name__
             for layer in model.layers]
    assert kinds == ["GatedDeltaNet"] * 3 + ["FullAttention"]
    ids = torch.randint(0, 257, (2, 24))
    logits = model(ids)
    assert logits.shape == (2, 24, model.cfg.vocab_size) and torch.isfinite(logits).all()


def test_same_seed_same_weights_different_seed_differs() -> None:
    a, b, c = build_model("tiny", seed=1), build_model("tiny", seed=1), build_model("tiny", seed=2)
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), n
    assert any(not torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters(), strict=True))


def test_loss_is_global_mean_and_splits_over_shards() -> None:
    """Summed over sequence shards with the global count, the loss is the mean over valid labels."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 16, 11, generator=gen)
    labels = torch.randint(0, 11, (2, 16), generator=gen)
    labels[1, 9:] = IGNORE_INDEX
    n = int((labels != IGNORE_INDEX).sum())
    full = HybridModel.loss(logits, labels, n)
    expected = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(full, expected)
    parts = sum(HybridModel.loss(logits[:, i : i + 4], labels[:, i : i + 4], n) for i in range(0, 16, 4))
    torch.testing.assert_close(parts, full)


def test_padding_does_not_leak_into_valid_tokens() -> None:
    """Tail padding: valid positions do not depend on what the padded tokens are."""
    model = build_model("tiny", seed=0)
    ids = torch.randint(0, 257, (1, 32))
    mask = torch.ones(1, 32, dtype=torch.long)
    mask[0, 20:] = 0
    other = ids.clone()
    other[0, 20:] = torch.randint(0, 257, (12,))
    a, b = model(ids, mask), model(other, mask)
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=0)


def test_attention_general_mask_path_matches_tail_path() -> None:
    """A mask with a hole uses the explicit-mask path; on a prefix-valid mask both paths agree."""
    cfg = model_config("tiny", layer_types=("full_attention",) * 2, num_layers=2)
    model = build_model(cfg, seed=0)
    ids = torch.randint(0, 257, (1, 16))
    tail = torch.ones(1, 16, dtype=torch.long)
    tail[0, 12:] = 0
    hole = tail.clone()
    hole[0, 5] = 0
    out_tail, out_hole = model(ids, tail), model(ids, hole)
    torch.testing.assert_close(out_tail[:, :5], out_hole[:, :5])  # before the hole nothing changes
    assert not torch.allclose(out_tail[:, 6:12], out_hole[:, 6:12])  # after it the hole is masked out


def test_activation_checkpoint_is_bit_identical_on_one_process() -> None:
    ids = torch.randint(0, 257, (1, 32))
    grads = []
    for mode in ("off", "full"):
        model = apply_activation_checkpoint(build_model("tiny", seed=0), mode)
        model(ids).square().mean().backward()
        grads.append(dict((n, p.grad) for n, p in model.named_parameters()))
        names = [n for n, _ in named_full_parameters(model)]
        assert not any("_checkpoint_wrapped_module" in n for n in names)
    off, full = grads
    assert len(off) == len(full)
    for (n, g), h in zip(off.items(), full.values(), strict=True):
        assert torch.equal(g, h), n


def test_global_grad_norm_single_process() -> None:
    model = build_model("tiny", seed=0)
    model(torch.randint(0, 257, (1, 8))).sum().backward()
    expected = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters()))
    assert global_grad_norm(model) == pytest.approx(float(expected), rel=1e-12)


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown model config 'huge'; expected one of"):
        model_config("huge")
    with pytest.raises(ValueError, match=r"layer_types has 1 entries, expected num_layers=4"):
        ModelConfig(layer_types=("full_attention",))
    with pytest.raises(ValueError, match=r"unknown layer type\(s\) \['mamba'\]"):
        ModelConfig(num_layers=1, layer_types=("mamba",))
    with pytest.raises(ValueError, match=r"num_attention_heads=6 must be a multiple of num_kv_heads=4"):
        ModelConfig(num_attention_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match=r"backend='auto' is not supported"):
        build_model("tiny", backend="auto")
    model = build_model("tiny", seed=0)
    with pytest.raises(ValueError, match=r"input_ids must be \[B, T_local\], got shape \(8,\)"):
        model(torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask must have input_ids' shape \(1, 8\), got \(1, 7\)"):
        model(torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"num_valid must be >= 1"):
        HybridModel.loss(torch.zeros(1, 2, 5), torch.full((1, 2), IGNORE_INDEX), 0)
    with pytest.raises(ValueError, match=r"activation checkpoint mode 'some' is not supported"):
        apply_activation_checkpoint(model, "some")
