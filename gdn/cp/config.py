"""Context-parallel configuration: the mode, the process group, and contiguous sequence sharding.

Rank r of a CP group of size P holds tokens [r·T/P, (r+1)·T/P) of every sample. The padding mask
[B, T_local] (1 = valid) is sharded the same way and travels with the shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal, get_args

import torch
import torch.distributed as dist

from gdn.ops import UnsupportedGDNRequest

CPMode = Literal["none", "ulysses", "p2p", "all_gather"]
CP_MODES: tuple[str, ...] = get_args(CPMode)
DEFAULT_TIMEOUT = timedelta(minutes=5)


class CPError(ValueError):
    """A CP request that cannot run as asked (shapes, group, mode); the message names the bad value."""


class CPCommError(RuntimeError):
    """A CP message arrived out of order, or a collective or point-to-point transfer timed out."""


@dataclass
class CPStats:
    """Counters of one CP group's traffic, shared by every layer that uses the same `CPConfig`.

    `hops[kind]` counts messages this rank sent/received per kind (`state_fwd`, `state_bwd`,
    `halo_fwd`, `halo_bwd`); `seq` numbers each (kind, peer) channel so a receiver can check that
    the message it got is the one it expects (order check, see `gdn.cp.comm`). `wait_ms` is host
    time spent blocked in receives, per kind: what the chain costs beyond compute.
    """

    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    wait_ms: dict[str, float] = field(default_factory=dict)
    order_checks: int = 0
    seq: dict[tuple[str, str, int], int] = field(default_factory=dict)

    def next_seq(self, kind: str, direction: str, peer: int) -> int:
        key = (kind, direction, peer)
        n = self.seq.get(key, 0)
        self.seq[key] = n + 1
        return n

    def reset(self) -> None:
        """Clear the counters and timings but keep channel sequence numbers (they must stay in step)."""
        self.sent.clear()
        self.received.clear()
        self.wait_ms.clear()
        self.order_checks = 0


@dataclass
class CPConfig:
    """How a layer is split over a CP group.

    mode: "none" (no CP; `group` ignored), "ulysses" (all-to-all: sequence shards <-> head shards),
    "p2p" (state chain rank -> rank), "all_gather" (every rank gathers all shard summaries; eager
    backend only). group: the CP process group; None means the default (world) group.
    timeout: limit for every CP transfer this config issues; a hang becomes a `CPCommError`.
    """

    mode: CPMode = "none"
    group: dist.ProcessGroup | None = None
    timeout: timedelta = DEFAULT_TIMEOUT
    # P2P with the Triton core: pass states on from inside the core, as soon as its state passes
    # have them (gdn/cp/p2p.py); False passes them after the whole shard pass, as a comparison
    early_state: bool = True
    stats: CPStats = field(default_factory=CPStats, compare=False, repr=False)
    # Sends in flight. They are held here, not only by the op that started them, because a forward
    # may be cut short (activation-checkpoint recomputation stops early) and a dropped send never
    # arrives; `gdn.cp.comm.drain_sends` waits for them.
    inflight: list = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in CP_MODES:
            raise CPError(f"unknown CP mode {self.mode!r}; expected one of {', '.join(map(repr, CP_MODES))}")
        if self.mode != "none" and not dist.is_initialized():
            raise CPError(
                f"CP mode {self.mode!r} needs an initialised torch.distributed process group "
                "(call init_process_group first), or use mode='none'"
            )

    @property
    def enabled(self) -> bool:
        """True when the sequence is actually split (a mode other than none and more than one rank)."""
        return self.mode != "none" and self.world_size > 1

    @property
    def world_size(self) -> int:
        return 1 if self.mode == "none" else dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return 0 if self.mode == "none" else dist.get_rank(self.group)

    def global_rank(self, group_rank: int) -> int:
        """The default-group rank of `group_rank` of this CP group (point-to-point ops take those)."""
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def check_backend(self, backend: str) -> None:
        """Fail fast on combinations the report leaves out of scope (no silent fall-back)."""
        if self.mode == "all_gather" and backend == "triton":
            raise UnsupportedGDNRequest(
                "CP mode 'all_gather' supports only backend='eager' (all_gather + triton is out of "
                "scope); use mode 'p2p' or 'ulysses' with backend='triton', or backend='eager'"
            )

    def check_world_size(self, expected: int) -> None:
        """Raise when the group does not have the size the caller planned for (e.g. a job's world size)."""
        if self.world_size != expected:
            raise CPError(
                f"CP group size mismatch: the {self.mode!r} group has {self.world_size} ranks, "
                f"expected {expected}"
            )


def ulysses_misfit(num_qk_heads: int, num_v_heads: int, world_size: int) -> str | None:
    """Why Ulysses cannot split these heads over `world_size` ranks (it gives each rank a whole
    share of the heads), or None."""
    if num_qk_heads % world_size or num_v_heads % world_size:
        return (
            f"Ulysses needs the heads divisible by the CP size {world_size}: num_qk_heads={num_qk_heads}, "
            f"num_v_heads={num_v_heads}; use a CP size dividing both, or mode 'p2p'"
        )
    return None


def packed_shard_misfit(cu_seqlens: list[int], local_len: int, world_size: int, mode: str) -> str | None:
    """Why packed sequences (`cu_seqlens` offsets over the global T) cannot run under AllGather, or
    None. Rank r holds tokens [r·T_local, (r+1)·T_local); a sequence that starts on one rank and
    ends on another needs its state, and only its state, carried over the boundary, which P2P does
    and AllGather does not: the first such sequence and boundary are named."""
    for r in range(1, world_size):
        edge = r * local_len
        for i in range(len(cu_seqlens) - 1):
            a, b = cu_seqlens[i], cu_seqlens[i + 1]
            if a < edge < b:
                return (f"CP mode {mode!r} with packed sequences: sequence {i} (tokens [{a}, {b})) "
                        f"crosses the boundary at token {edge} between rank {r - 1} and rank {r} "
                        f"(T_local={local_len}); this mode does not carry one sequence's state across "
                        f"ranks: pack so that every boundary k·{local_len} is a cu_seqlens offset, or "
                        f"use mode 'p2p' or 'ulysses'")
    return None


def cp_world_size(cp: CPConfig | None) -> int:
    return 1 if cp is None else cp.world_size


def cp_rank(cp: CPConfig | None) -> int:
    return 0 if cp is None else cp.rank


def shard_range(seq_len: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank `rank`'s contiguous shard; the length must divide by the world size."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise CPError(f"rank {rank} is not in a group of size {world_size}")
    if seq_len % world_size:
        raise CPError(
            f"sequence length {seq_len} is not divisible by the CP size {world_size}; "
            f"pad it to a multiple of {world_size}"
        )
    local = seq_len // world_size
    return rank * local, (rank + 1) * local


def shard_sequence(x: torch.Tensor, cp: CPConfig | None, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous shard of `x` along `dim` (the whole tensor without CP)."""
    size = cp_world_size(cp)
    if size == 1:
        return x
    start, end = shard_range(x.shape[dim], size, cp_rank(cp))
    return x.narrow(dim, start, end - start)
