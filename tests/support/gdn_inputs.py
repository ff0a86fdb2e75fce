"""Random gated-delta-rule inputs shaped like a real layer's: l2-normalised k, beta in (0, 1),
log-space decays from a log-sigmoid, so every test draws from one valid distribution."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GDNInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    h0: torch.Tensor | None

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.q, self.k, self.v, self.g, self.beta, self.h0) if t is not None]

    def requires_grad_(self) -> GDNInputs:
        for t in self.tensors():
            t.requires_grad_(True)
        return self


def make_inputs(
    batch: int,
    seq_len: int,
    num_qk_heads: int,
    num_v_heads: int,
    head_dim: int,
    *,
    dtype: torch.dtype = torch.float64,
    stateful: bool = True,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> GDNInputs:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = rand(batch, seq_len, num_qk_heads, head_dim)
    k = F.normalize(rand(batch, seq_len, num_qk_heads, head_dim), dim=-1)
    v = rand(batch, seq_len, num_v_heads, head_dim)
    g = F.logsigmoid(rand(batch, seq_len, num_v_heads) + 2.0)  # decays mostly near 1, some strong
    beta = torch.sigmoid(rand(batch, seq_len, num_v_heads))
    h0 = rand(batch, num_v_heads, head_dim, head_dim) * 0.1 if stateful else None

    def cast(t: torch.Tensor | None, dt: torch.dtype) -> torch.Tensor | None:
        return None if t is None else t.to(device=device, dtype=dt)

    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return GDNInputs(
        q=cast(q, dtype),
        k=cast(k, dtype),
        v=cast(v, dtype),
        g=cast(g, state_dtype),
        beta=cast(beta, dtype),
        h0=cast(h0, state_dtype),
    )


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, b = actual.detach().double(), expected.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()
