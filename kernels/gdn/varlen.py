"""Packed sequences (`cu_seqlens`, the FLA convention) in one launch chain for any number of
sequences: one state per sequence, none crossing a boundary.

The packed rows are read and written in place. The chunk table (`chunks.ChunkTable`) gives every
chunk its own first and end row, each sequence's chunks starting at its first row, so no chunk
straddles a boundary and no padded copy of any tensor exists: every chunk-parallel stage (gate,
intra, output, dvn_local, dqk and wy_bwd) takes chunk c's rows from the table
instead of c·BT and masks at the chunk's end instead of T; per-chunk intermediates are indexed by
chunk, row-shaped ones stay in the packed rows. The state passes walk each sequence's chunk range
(`seq_chunks`) from its own h0 (and in the backward from its own dht, to its own dh0), all
sequences in parallel in one launch.
"""

from __future__ import annotations

import torch

from kernels.gdn.chunks import ChunkTable
from kernels.gdn.config import KernelConfig
from kernels.gdn.function import check_heads, run_chunked
from kernels.offsets import check_cu_seqlens


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
    config: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule over N packed sequences: inputs [1, T, H, 128] with sequence i at rows
    cu_seqlens[i]:cu_seqlens[i+1] (`kernels.offsets.check_cu_seqlens`: every sequence holds a
    token); initial_state and the final state [N, Hv, 128, 128] fp32. One launch chain for all N
    sequences, in place (the chunk table, the module docstring)."""
    cu = check_cu_seqlens(cu_seqlens, batch=q.shape[0], seq_len=q.shape[1])
    n, hv = len(cu) - 1, v.shape[2]
    if initial_state is not None and tuple(initial_state.shape) != (n, hv, v.shape[3], v.shape[3]):
        raise ValueError(f"initial_state must be [N={n}, Hv={hv}, 128, 128] for {n} sequences, "
                         f"got {tuple(initial_state.shape)}")
    check_heads(q, v)
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state, config=config)
    if n == 1:  # one sequence is the dense case (which may also split it into parallel segments)
        return run_chunked(q, k, v, g, beta, **kw)
    return run_chunked(q, k, v, g, beta, **kw, table=ChunkTable.of(cu, q.device))
