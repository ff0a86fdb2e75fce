"""The one rule for packed-sequence offsets (`cu_seqlens`, the FLA / flash-attention convention),
shared by `gdn.gated_delta_rule` for every backend and by the Triton kernels' packed path.

Torch only, no Triton: `gdn.packing` imports it when it checks offsets, so `import gdn` still
loads no kernels module.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch


def check_cu_seqlens(cu_seqlens: Any, *, batch: int, seq_len: int) -> list[int]:
    """The offsets as ints: a 1-D integer tensor of N + 1 >= 2 offsets rising strictly from 0 to
    `seq_len` over a batch of 1, so every sequence holds at least one token (the context-parallel
    shard maps and every backend's per-sequence runs rely on that); raises naming the bad value
    and what was expected."""
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
