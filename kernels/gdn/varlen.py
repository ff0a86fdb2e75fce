"""Packed sequences (`cu_seqlens`, the FLA convention): one state per sequence, none crossing a
boundary.

This runs the stage kernels once per sequence on its slice of the packed tensors (each sequence
its own chunk grid, initial and final state), so it is exact and shares every kernel with the
dense path, but it pays one set of launches per sequence: fine for a few long sequences, slow for
many short ones. A kernel-native varlen path (chunk offsets in every chunk-parallel stage, one
state walk per sequence inside one launch) is the next step (docs/kernels.md, "Not done").
"""

from __future__ import annotations

from itertools import pairwise

import torch

from kernels.gdn.function import gated_delta_rule_triton


def _boundaries(cu_seqlens: torch.Tensor, total: int) -> list[int]:
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor of N+1 offsets, got "
                         f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")  # fmt: skip
    cu = [int(x) for x in cu_seqlens.tolist()]
    if cu[0] != 0 or cu[-1] != total or any(b < a for a, b in pairwise(cu)):
        raise ValueError(f"cu_seqlens must rise from 0 to T={total} without decreasing, got {cu}")
    return cu


def gated_delta_rule_triton_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule over N packed sequences: inputs [1, T, H, 128] with sequence i at rows
    cu_seqlens[i]:cu_seqlens[i+1]; initial_state and the final state [N, Hv, 128, 128] fp32.
    An empty sequence passes its initial state (or zeros) through as its final state."""
    if q.shape[0] != 1:
        raise ValueError(f"packed sequences need batch 1 (the FLA convention), got batch {q.shape[0]}")
    cu = _boundaries(cu_seqlens, q.shape[1])
    n, hv = len(cu) - 1, v.shape[2]
    if initial_state is not None and tuple(initial_state.shape) != (n, hv, v.shape[3], v.shape[3]):
        raise ValueError(f"initial_state must be [N={n}, Hv={hv}, 128, 128] for {n} sequences, "
                         f"got {tuple(initial_state.shape)}")  # fmt: skip
    outs, finals = [], []
    for i, (a, b) in enumerate(pairwise(cu)):
        h0 = None if initial_state is None else initial_state[i : i + 1]
        if b == a:
            outs.append(v[:, a:b])
            if output_final_state:
                finals.append(h0.float() if h0 is not None else v.new_zeros(1, hv, v.shape[3], v.shape[3],
                                                                            dtype=torch.float32))  # fmt: skip
            continue
        o, ht = gated_delta_rule_triton(
            q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b],
            scale=scale, initial_state=h0, output_final_state=output_final_state,
        )  # fmt: skip
        outs.append(o)
        if output_final_state:
            finals.append(ht)
    return torch.cat(outs, dim=1), (torch.cat(finals, dim=0) if output_final_state else None)
