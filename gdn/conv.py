"""Causal depthwise Conv1D as shifted multiply-adds in fp32 (fp64 for fp64 inputs).

Why not `F.conv1d`: under bf16 autocast cuDNN picks its algorithm by sequence length, so the
same tokens convolved as one 32K sequence or as CP shards with a halo came out different (the
H200 emulation's input gradient moved 10x between 8K and 32K), and its weight gradient, a sum
over every token, was accumulated in the low precision. Here every output element is the same
K products in the same order wherever the sequence is cut, so a shard with its halo is
bit-identical to the unsharded sequence, and both gradients accumulate in fp32.

Memory: only the input (in its own dtype) and the weight are saved; the backward works in slices
of tokens so its fp32 temporaries stay bounded.
"""

from __future__ import annotations

import torch

_TOKENS_PER_SLICE = 8192


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 inside for low-precision activations; fp64 stays fp64 (the exact tests run in fp64)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class _CausalDepthwiseConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        K = weight.shape[-1]
        T = x.shape[1] - (K - 1)
        cdt = compute_dtype(x)
        w = weight.reshape(weight.shape[0], K).to(cdt)
        out = x.new_empty(x.shape[0], T, x.shape[2])
        for s in range(0, T, _TOKENS_PER_SLICE):
            e = min(T, s + _TOKENS_PER_SLICE)
            xs = x[:, s : e + K - 1].to(cdt)  # one conversion per slice; the taps are views of it
            acc = xs[:, : e - s] * w[:, 0]
            for j in range(1, K):
                acc.addcmul_(xs[:, j : j + e - s], w[:, j])
            out[:, s:e] = acc
        ctx.save_for_backward(x, weight)
        return out

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        K = weight.shape[-1]
        T = dy.shape[1]
        cdt = compute_dtype(x)
        w = weight.reshape(weight.shape[0], K).to(cdt)
        dx = torch.zeros(x.shape, dtype=cdt, device=x.device)
        dw = torch.zeros(w.shape, dtype=cdt, device=x.device)
        for s in range(0, T, _TOKENS_PER_SLICE):
            e = min(T, s + _TOKENS_PER_SLICE)
            g = dy[:, s:e].to(cdt)
            xs = x[:, s : e + K - 1].to(cdt)
            for j in range(K):
                dx[:, s + j : e + j].addcmul_(g, w[:, j])
                dw[:, j] += (xs[:, j : j + e - s] * g).sum(dim=(0, 1))
        return dx.to(x.dtype), dw.reshape(weight.shape).to(weight.dtype)


def causal_depthwise_conv1d(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[B, K-1+T, C] (the K-1 tokens before the sequence first) with weight [C, 1, K] -> [B, T, C].

    out[t, c] = sum_j weight[c, 0, j] · x[t + j, c], in x's dtype.
    """
    if weight.dim() != 3 or weight.shape[1] != 1:
        raise ValueError(f"weight must be [channels, 1, kernel] (depthwise), got {tuple(weight.shape)}")
    if x.dim() != 3 or x.shape[2] != weight.shape[0] or x.shape[1] < weight.shape[2]:
        raise ValueError(
            f"x must be [B, kernel-1+T, channels={weight.shape[0]}] with T >= 1, got {tuple(x.shape)}"
        )
    return _CausalDepthwiseConv.apply(x, weight)
