"""Context parallelism for the GatedDeltaNet layer: Ulysses, P2P state chain, AllGather, Conv1D halo."""

from gdn.cp.config import (
    CP_MODES,
    CPCommError,
    CPConfig,
    CPError,
    CPMode,
    CPStats,
    cp_rank,
    cp_world_size,
    shard_range,
    shard_sequence,
)
from gdn.cp.p2p import all_gather_gated_delta_rule, p2p_gated_delta_rule
from gdn.cp.summary import apply_transition, merge_prefix, state_summary

__all__ = [
    "CP_MODES",
    "CPCommError",
    "CPConfig",
    "CPError",
    "CPMode",
    "CPStats",
    "all_gather_gated_delta_rule",
    "apply_transition",
    "cp_rank",
    "cp_world_size",
    "merge_prefix",
    "p2p_gated_delta_rule",
    "shard_range",
    "shard_sequence",
    "state_summary",
]
