"""Packed variable-length sequences (`cu_seqlens`, the FLA / flash-attention convention).

Inputs are [1, T, H, D] holding N sequences back to back, sequence i at rows
cu_seqlens[i]:cu_seqlens[i+1]; each has its own initial and final state ([N, Hv, Dk, Dv]) and no
state crosses a boundary. The offsets are checked here, once, for every backend.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch


def check_cu_seqlens(cu_seqlens: Any, *, batch: int, seq_len: int) -> list[int]:
    """The offsets as ints; raises ValueError naming the bad value and what was expected."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor of N+1 offsets, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point() or (
        cu_seqlens.dtype == torch.bool
    ):
        raise ValueError(
            f"cu_seqlens must be a 1-D integer tensor of N+1 >= 2 offsets, got {cu_seqlens.dtype} "
            f"of shape {tuple(cu_seqlens.shape)}"
        )
    if batch != 1:
        raise ValueError(f"packed sequences (cu_seqlens) need batch 1 (the FLA convention), got {batch}")
    cu = [int(x) for x in cu_seqlens.tolist()]
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0]} (cu_seqlens={cu})")
    if cu[-1] != seq_len:
        raise ValueError(f"cu_seqlens must end at T={seq_len}, got {cu[-1]} (cu_seqlens={cu})")
    for i, (a, b) in enumerate(pairwise(cu)):
        if b <= a:
            raise ValueError(
                f"cu_seqlens must be strictly increasing (every sequence >= 1 token), got "
                f"cu_seqlens[{i}]={a} then cu_seqlens[{i + 1}]={b} (cu_seqlens={cu})"
            )
    return cu


def per_sequence(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor | None]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run a dense `fn` on each packed sequence's slice and join the results: outputs along T,
    final states along the sequence dim. Autograd flows through the slices to every input."""
    cu = [int(x) for x in cu_seqlens.tolist()]
    outs, finals = [], []
    for i, (a, b) in enumerate(pairwise(cu)):
        h0 = None if initial_state is None else initial_state[i : i + 1]
        o, ht = fn(
            q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b],
            initial_state=h0, output_final_state=output_final_state, **kwargs,
        )
        outs.append(o)
        if output_final_state:
            finals.append(ht)
    return torch.cat(outs, dim=1), (torch.cat(finals, dim=0) if output_final_state else None)


def shard_segments(cu: list[int], lo: int, length: int) -> tuple[list[int], bool, int]:
    """How checked offsets `cu` (over the global T) cut the shard of tokens [lo, lo + length):
    (its local offsets [0, ..., length], whether its first token continues a sequence begun
    before lo, the global token where the sequence holding token lo began). One rule for the
    distributed P2P layer and its single-process emulation."""
    segments = [0, *(s - lo for s in cu if lo < s < lo + length), length]
    start = max(s for s in cu if s <= lo)
    return segments, start != lo, start
