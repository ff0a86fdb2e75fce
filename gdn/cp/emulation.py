"""Single-process emulation of P2P context parallelism: P shards of one sequence, run serially.

It runs exactly the arithmetic the distributed P2P path runs (per-shard summaries (M, S_ext) from
the backend's own calls, the fp32 state chain, each shard's pass from its incoming state, the
Conv1D halo taken from the previous shard), only without processes: so the Triton CP path can be
checked against the no-CP Triton result on one GPU at P = 4 or 8. Gradients come from autograd
through the same pieces (the reverse chain is the backward of `apply_transition`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn.cp.config import CPError, shard_range
from gdn.cp.summary import apply_transition, state_summary
from gdn.layer import GatedDeltaNet
from gdn.ops import gated_delta_rule


@dataclass
class EmulationStats:
    """Hops the emulated chain made (P-1 forward, the same backward through autograd)."""

    forward_hops: int = 0


def emulated_p2p_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    num_shards: int,
    backend: str = "eager",
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    stats: EmulationStats | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, final state) of the full sequence, computed as `num_shards` P2P shards.

    Like the distributed path: shard 0 runs from the initial state and yields its end state; shards
    1..P-2 compute (M, S_ext) without waiting; the chain S ← M·S + S_ext runs in fp32; every shard
    then runs its pass from its incoming state. The final state is chained through the last shard.
    """
    T = q.shape[1]
    bounds = [shard_range(T, num_shards, r) for r in range(num_shards)]

    def piece(t: torch.Tensor, r: int) -> torch.Tensor:
        return t[:, bounds[r][0] : bounds[r][1]]

    def run(r: int, s0: torch.Tensor | None, final: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        return gated_delta_rule(
            piece(q, r), piece(k, r), piece(v, r), piece(g, r), piece(beta, r),
            initial_state=s0, output_final_state=final, backend=backend, chunk_size=chunk_size,  # type: ignore[arg-type]
        )  # fmt: skip

    # 1. every shard's summary "at once" (no dependence on the chain)
    summaries = []
    for r in range(1, num_shards):
        shard = [piece(t, r) for t in (q, k, v, g, beta)]
        summaries.append(state_summary(*shard, backend=backend, chunk_size=chunk_size))
    # 2. shard 0 and the chain
    o0, s = run(0, initial_state, True)
    states_in = []
    for m, ext in summaries:
        states_in.append(s)
        s = apply_transition(m, s, ext)  # type: ignore[arg-type]
        if stats is not None:
            stats.forward_hops += 1
    # 3. every other shard from its incoming state
    outs = [o0] + [run(r, states_in[r - 1], False)[0] for r in range(1, num_shards)]
    return torch.cat(outs, dim=1), s  # type: ignore[return-value]


def emulated_p2p_layer(
    layer: GatedDeltaNet,
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    num_shards: int,
    stats: EmulationStats | None = None,
) -> torch.Tensor:
    """The layer's output on the full sequence, computed as `num_shards` P2P shards in one process.

    Each shard's conv sees the previous shard's last conv_size-1 tokens (the halo), zeros for
    shard 0; the core runs through `emulated_p2p_gated_delta_rule`. The layer's own CP config is
    not used.
    """
    c = layer.config
    m = layer.check_input(x, mask)
    T = x.shape[1]
    width = c.conv_size - 1
    bounds = [shard_range(T, num_shards, r) for r in range(num_shards)]
    if bounds[0][1] < width:
        raise CPError(
            f"local sequence length {bounds[0][1]} is shorter than the Conv1D halo {width}; "
            f"each of the {num_shards} shards needs at least {width} tokens"
        )
    qkv, z, b, a = layer.project(x, m)
    conv = [
        layer.conv(qkv[:, s:e], qkv[:, s - width : s] if s > 0 else None)  # halo from the shard before
        for s, e in bounds
    ]
    q, k, v = layer.split_qkv(torch.cat(conv, dim=1), c.num_qk_heads, c.num_v_heads)
    g, beta = layer.gates(b, a, m)
    o, _ = emulated_p2p_gated_delta_rule(
        q, k, v, g, beta, num_shards=num_shards, backend=layer.backend, chunk_size=layer.chunk_size,
        stats=stats,
    )  # fmt: skip
    return layer.finish(o, z, m)
