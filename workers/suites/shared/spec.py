"""What the suites' specs share, torch-free: the report's shapes."""

from __future__ import annotations

# The report's production shapes: the GDN head dim and value heads, and the global sequence lengths
# the core is measured at (cp-layer adds 128K).
HEAD_DIM = 128
V_HEADS = 32
REPORT_SEQ_LENS = (8192, 16384, 32768, 65536)
# The chunk length of the Triton kernels (and of the chunked eager backend by default).
CHUNK = 64
# Packed batches (sequence lengths, B = 1, `cu_seqlens`): 8 sequences of mixed lengths (1, 63, 64,
# 65: boundaries inside, on and across a chunk) summing to 16K / 64K.
PACKED_16K = (1, 63, 64, 65, 1000, 3000, 4096, 8095)
PACKED_64K = (4096, 12288, 1, 65, 8192, 16384, 20000, 4510)
