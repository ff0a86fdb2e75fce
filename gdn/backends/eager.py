"""The `eager` backend's entry: gdn.reference's chunked form with autograd, under the backend
protocol's keywords (and `chunk_size`, the one option it takes).

A function of its own, not the reference itself: the accuracy oracles and other callers of
`chunk_gated_delta_rule_eager` stay the reference whatever the backend's entry becomes.
"""

from __future__ import annotations

import torch

from gdn.reference import chunk_gated_delta_rule_eager


def eager_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The `eager` backend: the chunked torch form, dense or packed (`cu_seqlens`)."""
    return chunk_gated_delta_rule_eager(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, chunk_size=chunk_size, cu_seqlens=cu_seqlens,
    )
