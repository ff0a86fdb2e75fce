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
    seq_chunks[i] .. seq_chunks[i+1] (none for an empty one). Per-chunk intermediates are indexed
    by chunk (NT of them), row-shaped ones stay in the packed rows. `counts`: each sequence's
    number of chunks, on the host (for `groups`)."""

    spans: torch.Tensor
    seq_chunks: torch.Tensor
    counts: tuple[int, ...]

    @classmethod
    def of(cls, cu: list[int], device: torch.device) -> ChunkTable:
        spans, seq_chunks = [], [0]
        for a, b in pairwise(cu):
            spans += [(r, min(r + BT, b)) for r in range(a, b, BT)]
            seq_chunks.append(len(spans))
        flat = torch.tensor(spans, dtype=torch.int32).view(-1, 2)
        counts = tuple(b - a for a, b in pairwise(seq_chunks))
        return cls(flat.to(device), torch.tensor(seq_chunks, dtype=torch.int32, device=device), counts)

    def groups(self, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunk groups of at most `stride` chunks that never cross a sequence: `groups` [NG, 2]
        int32, each group's first chunk and end chunk (exclusive), in sequence order, and
        `seq_groups` [N + 1] int32, sequence i's groups seq_groups[i] .. seq_groups[i+1] (what the
        states at a stride are indexed by)."""
        groups, seq_groups, c0 = [], [0], 0
        for n in self.counts:
            groups += [(c, min(c + stride, c0 + n)) for c in range(c0, c0 + n, stride)]
            seq_groups.append(len(groups))
            c0 += n
        dev = self.spans.device
        flat = torch.tensor(groups, dtype=torch.int32).view(-1, 2)
        return flat.to(dev), torch.tensor(seq_groups, dtype=torch.int32, device=dev)


def table_parts(table: ChunkTable | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(spans, seq_chunks) of a chunk table, (None, None) for a dense sequence: what the stages take."""
    return (None, None) if table is None else (table.spans, table.seq_chunks)
