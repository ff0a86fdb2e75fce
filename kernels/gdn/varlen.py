"""Packed sequences (`cu_seqlens`, the FLA convention) in one launch chain for any number of
sequences: one state per sequence, none crossing a boundary.

Chunk-aligned packing. Every sequence but the last non-empty one is padded to a multiple of the
chunk size with rows of q = k = v = 0, β = 0 and log-gate 0. Such a row leaves the state as it
is (S·e⁰ + 0) and, coming after the sequence's real rows in causal order, touches none of them,
so no chunk straddles a boundary and every chunk-parallel stage (gate, intra, output, dvn_local,
dqk, wy_bwd and the fused variants) runs unchanged on the padded [1, T', H, D] tensors. Only the
state passes know about sequences: `seq_chunks` gives each sequence's chunk range, walked from
its own h0 (and in the backward from its own dht, to its own dh0), all sequences in parallel in
one launch. The padding is a scatter of rows with the gap rows zeroed (its backward gathers
them) and the output's unpadding a gather (its backward scatters, so padded rows get no
gradient). When every sequence but the last already ends on a chunk edge nothing is copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch

from kernels.gdn.config import BT
from kernels.gdn.function import check_heads, run_chunked


def _boundaries(cu_seqlens: torch.Tensor, total: int) -> list[int]:
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor of N+1 offsets, got "
                         f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")  # fmt: skip
    cu = [int(x) for x in cu_seqlens.tolist()]
    if cu[0] != 0 or cu[-1] != total or any(b < a for a, b in pairwise(cu)):
        raise ValueError(f"cu_seqlens must rise from 0 to T={total} without decreasing, got {cu}")
    return cu


class _MoveRows(torch.autograd.Function):
    """Rows of dim 1 moved between the packed and the padded layout: `pad` scatters the T input
    rows into the padded length (the gap rows zero), else the rows are gathered back. Each
    direction's backward is the other one (indices are unique: no accumulation, no atomics)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, layout: PackedLayout, pad: bool
    ) -> torch.Tensor:
        ctx.layout, ctx.pad = layout, pad
        return layout.scatter(x) if pad else x.index_select(1, layout.rows)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        lay, grad = ctx.layout, grad.contiguous()
        return (grad.index_select(1, lay.rows) if ctx.pad else lay.scatter(grad)), None, None


@dataclass(frozen=True)
class PackedLayout:
    """Where the packed sequences sit once each starts on a chunk edge.

    `starts[i]` is sequence i's first row in the padded layout (a multiple of BT), `total` the
    padded length T' (the last non-empty sequence is not padded: its short last chunk is masked as
    in the dense path), `seq_chunks` the N+1 int32 chunk offsets the state passes walk, `rows` the
    padded row of every input row and `gaps` the padded rows between sequences (both None when no
    row moves and nothing is copied)."""

    starts: tuple[int, ...]
    total: int
    seq_chunks: torch.Tensor
    rows: torch.Tensor | None
    gaps: torch.Tensor | None

    @classmethod
    def of(cls, cu: list[int], device: torch.device) -> PackedLayout:
        lens = [b - a for a, b in pairwise(cu)]
        starts, end = [], 0
        for n in lens:
            starts.append(end)
            end += -(-n // BT) * BT
        filled = [i for i, n in enumerate(lens) if n]
        total = starts[filled[-1]] + lens[filled[-1]] if filled else 0
        seq_chunks = torch.tensor([s // BT for s in starts] + [end // BT], dtype=torch.int32, device=device)
        shifts = [s - a if n else 0 for s, a, n in zip(starts, cu[:-1], lens, strict=True)]
        if not any(shifts):
            return cls(tuple(starts), total, seq_chunks, None, None)
        rows = torch.arange(cu[-1], device=device) + torch.repeat_interleave(
            torch.tensor(shifts, device=device), torch.tensor(lens, device=device), output_size=cu[-1]
        )
        gaps = [r for i in filled[:-1] for r in range(starts[i] + lens[i], starts[i + 1])]
        gap_rows = torch.tensor(gaps, dtype=torch.int64, device=device)
        return cls(tuple(starts), total, seq_chunks, rows, gap_rows)

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """[1, T, ...] -> [1, T', ...]: every row to its padded place, the gaps zero (one pass over
        x, not a zero-filled copy first)."""
        out = x.new_empty((x.shape[0], self.total, *x.shape[2:])).index_copy_(1, self.rows, x.contiguous())
        return out.index_fill_(1, self.gaps, 0) if self.gaps.numel() else out

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[1, T, ...] packed -> [1, T', ...] chunk-aligned, zeros between sequences."""
        return x if self.rows is None else _MoveRows.apply(x, self, True)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """[1, T', ...] chunk-aligned -> [1, T, ...] packed."""
        return x if self.rows is None else _MoveRows.apply(x, self, False)


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
    An empty sequence passes its initial state (or zeros) through as its final state.
    One launch chain for all N sequences (chunk-aligned packing, the module docstring)."""
    if q.shape[0] != 1:
        raise ValueError(f"packed sequences need batch 1 (the FLA convention), got batch {q.shape[0]}")
    cu = _boundaries(cu_seqlens, q.shape[1])
    n, hv = len(cu) - 1, v.shape[2]
    if initial_state is not None and tuple(initial_state.shape) != (n, hv, v.shape[3], v.shape[3]):
        raise ValueError(f"initial_state must be [N={n}, Hv={hv}, 128, 128] for {n} sequences, "
                         f"got {tuple(initial_state.shape)}")  # fmt: skip
    check_heads(q, v)
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if cu[-1] == 0:  # nothing to run: every final state is its initial state
        ht = None
        if output_final_state:
            ht = (initial_state.to(torch.float32, copy=True) if initial_state is not None
                  else v.new_zeros(n, hv, v.shape[3], v.shape[3], dtype=torch.float32))  # fmt: skip
        return v * 0, ht  # empty, and still in v's graph as the output was before
    if n == 1:  # one sequence is the dense case (which may also split it into parallel segments)
        return run_chunked(q, k, v, g, beta, **kw)
    layout = PackedLayout.of(cu, q.device)
    o, ht = run_chunked(*(layout.pad(t) for t in (q, k, v, g, beta)), **kw, seq_chunks=layout.seq_chunks)
    return layout.unpad(o), ht
