"""Single-process emulation of P2P context parallelism: P shards of one sequence, run serially.

It runs exactly the arithmetic the distributed P2P path runs (per-shard summaries (M, S_ext) from
the backend's own calls, the fp32 state chain, each shard's pass from its incoming state, the
Conv1D halo taken from the previous shard), only without processes: so the Triton CP path can be
checked against the no-CP Triton result on one GPU at P = 4 or 8. Gradients come from autograd
through the same pieces (the reverse chain is the backward of `apply_transition`).

A packed batch (`cu_seqlens`) runs the distributed layer's packed arithmetic too: when every shard
boundary is a sequence boundary each shard runs alone (no hops); otherwise the chain carries the
state of the sequence crossing each boundary, as `gdn.cp.p2p` describes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn.cp.config import CPError, packed_shard_misfit, shard_range
from gdn.cp.summary import apply_transition, state_dtype, state_summary
from gdn.layer import GatedDeltaNet
from gdn.ops import gated_delta_rule
from gdn.packing import check_cu_seqlens, shard_segments


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
        )

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
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The layer's output on the full sequence, computed as `num_shards` P2P shards in one process.

    Each shard's conv sees the previous shard's last conv_size-1 tokens (the halo), zeros for
    shard 0; the core runs through `emulated_p2p_gated_delta_rule`. The layer's own CP config is
    not used. `cu_seqlens` (B = 1): packed sequences, as the distributed P2P layer runs them.
    """
    c = layer.config
    m = layer.check_input(x, mask)
    T = x.shape[1]
    cu = None if cu_seqlens is None else check_cu_seqlens(cu_seqlens, batch=x.shape[0], seq_len=T)
    if cu is not None and len(cu) == 2:
        cu = None  # one sequence: the dense path, as the layer takes it
    width = c.conv_size - 1
    bounds = [shard_range(T, num_shards, r) for r in range(num_shards)]
    if bounds[0][1] < width:
        raise CPError(
            f"local sequence length {bounds[0][1]} is shorter than the Conv1D halo {width}; "
            f"each of the {num_shards} shards needs at least {width} tokens"
        )
    if cu is not None and packed_shard_misfit(cu, bounds[0][1], num_shards, "p2p") is None:
        # every shard boundary is a sequence boundary: each shard alone, no state crosses
        return torch.cat([layer(x[:, s:e], None if mask is None else mask[:, s:e], _offsets(cu, s, e - s))
                          for s, e in bounds], dim=1)
    qkv, z, b, a = layer.project(x, m)
    conv = [  # the halo from the shard before
        layer.shard_conv(qkv[:, s:e], qkv[:, s - width : s] if s > 0 else None, cu, s) for s, e in bounds
    ]
    q, k, v = layer.split_qkv(torch.cat(conv, dim=1), c.num_qk_heads, c.num_v_heads)
    g, beta = layer.gates(b, a, m)
    if cu is None:
        o, _ = emulated_p2p_gated_delta_rule(
            q, k, v, g, beta, num_shards=num_shards, backend=layer.backend, chunk_size=layer.chunk_size,
            stats=stats,
        )
    else:
        o = _emulated_packed_core(q, k, v, g, beta, cu, bounds, layer.backend, layer.chunk_size, stats)
    return layer.finish(o, z, m)


def _offsets(cu: list[int], lo: int, length: int) -> torch.Tensor:
    return torch.tensor(shard_segments(cu, lo, length)[0], dtype=torch.int32)


def _emulated_packed_core(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cu: list[int],
    bounds: list[tuple[int, int]], backend: str, chunk_size: int, stats: EmulationStats | None,
) -> torch.Tensor:
    """The packed P2P core over `bounds` (a sequence crosses at least one): a middle shard that is
    one sequence's middle keeps its summary (M, S_ext); any other shard's end state is its last
    segment's final state from zero (M = 0); a shard starting a sequence multiplies the state it
    receives by zero; every segment gets its own initial state."""
    _, _, Hv, dv = v.shape
    dk, sdt, P = k.shape[-1], state_dtype(v), len(bounds)
    kw = {"backend": backend, "chunk_size": chunk_size}
    cut = [shard_segments(cu, s, e - s) for s, e in bounds]

    def piece(t: torch.Tensor, r: int, a: int = 0) -> torch.Tensor:
        return t[:, bounds[r][0] + a : bounds[r][1]]

    def local_cu(r: int) -> torch.Tensor | None:
        segs = cut[r][0]
        return torch.tensor(segs, dtype=torch.int32, device=v.device) if len(segs) > 2 else None

    maps = {}  # 1. every middle shard's end-state map at once (no dependence on the chain)
    for r in range(1, P - 1):
        segs, continues, _ = cut[r]
        shard = [piece(t, r) for t in (q, k, v, g, beta)]
        if len(segs) == 2 and continues:
            maps[r] = state_summary(*shard, **kw)
        else:
            last = [piece(t, r, segs[-2]) for t in (q, k, v, g, beta)]
            _, ext = gated_delta_rule(*last, output_final_state=True, **kw)  # type: ignore[arg-type]
            maps[r] = (torch.zeros(1, Hv, dk, dk, dtype=sdt, device=v.device), ext)
    # 2. shard 0 (its first token starts a sequence) and the chain
    o0, finals = gated_delta_rule(*(piece(t, 0) for t in (q, k, v, g, beta)), output_final_state=True,
                                  cu_seqlens=local_cu(0), **kw)  # type: ignore[arg-type]
    s, states_in = finals[-1:], []
    for r in range(1, P):
        states_in.append(s)
        if stats is not None:
            stats.forward_hops += 1
        if r < P - 1:
            m_r, ext_r = maps[r]
            s = apply_transition(m_r, s, ext_r)  # type: ignore[arg-type]
    # 3. every other shard from its incoming state (zero for a shard that starts a sequence)
    outs = [o0]
    for r in range(1, P):
        segs, continues, _ = cut[r]
        first = states_in[r - 1] if continues else states_in[r - 1] * 0.0
        h0 = torch.cat([first, first.new_zeros(len(segs) - 2, Hv, dk, dv)]) if len(segs) > 2 else first
        o, _ = gated_delta_rule(*(piece(t, r) for t in (q, k, v, g, beta)), initial_state=h0,
                                cu_seqlens=local_cu(r), **kw)  # type: ignore[arg-type]
        outs.append(o)
    return torch.cat(outs, dim=1)
