"""Packed variable-length sequences (`cu_seqlens`, the FLA / flash-attention convention).

Inputs are [1, T, H, D] holding N sequences back to back, sequence i at rows
cu_seqlens[i]:cu_seqlens[i+1]; each has its own initial and final state ([N, Hv, Dk, Dv]) and no
state crosses a boundary. The offsets are checked here, once, for every backend, by the rule
the Triton kernels' packed path shares (`kernels.offsets`).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch


def check_cu_seqlens(cu_seqlens: Any, *, batch: int, seq_len: int) -> list[int]:
    """The offsets as ints, checked by the one rule the Triton kernels' packed path applies too
    (`kernels.offsets.check_cu_seqlens`, torch only; imported here, not at the top, so that
    `import gdn` loads no kernels module)."""
    from kernels.offsets import check_cu_seqlens as check

    return check(cu_seqlens, batch=batch, seq_len=seq_len)


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
