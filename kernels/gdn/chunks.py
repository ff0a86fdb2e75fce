"""The chunk table of packed sequences: which rows each chunk covers, so that every stage reads
and writes the packed rows in place and no chunk straddles a sequence boundary."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch

from kernels.gdn.config import BT


@dataclass(frozen=True)
class ChunkTable:
    """Chunks of N packed sequences (rows cu[i]:cu[i+1] of one [1, T, ...] batch).

    Sequence i has ceil(len_i / BT) chunks, the first at its own first row; the last one is short
    when len_i is not a multiple of BT and ends at the sequence's end (masked there as the dense
    path masks its short last chunk at T). `spans` [NT, 2] int32: each chunk's first row and end
    row (exclusive), in sequence order; `seq_chunks` [N + 1] int32: sequence i's chunks are
    seq_chunks[i] .. seq_chunks[i+1] (at least one: every sequence holds a token, `kernels.offsets`).
    Per-chunk intermediates are indexed by chunk (NT of them), row-shaped ones stay in the packed
    rows."""

    spans: torch.Tensor
    seq_chunks: torch.Tensor

    @classmethod
    def of(cls, cu: list[int], device: torch.device) -> ChunkTable:
        spans, seq_chunks = [], [0]
        for a, b in pairwise(cu):
            spans += [(r, min(r + BT, b)) for r in range(a, b, BT)]
            seq_chunks.append(len(spans))
        flat = torch.tensor(spans, dtype=torch.int32).view(-1, 2)
        return cls(flat.to(device), torch.tensor(seq_chunks, dtype=torch.int32, device=device))


def table_parts(table: ChunkTable | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(spans, seq_chunks) of a chunk table, (None, None) for a dense sequence: what the stages take."""
    return (None, None) if table is None else (table.spans, table.seq_chunks)
