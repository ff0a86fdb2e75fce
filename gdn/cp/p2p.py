"""P2P and AllGather context parallelism for the gated delta rule core (sequence-sharded inputs).

P2P, per rank r of P (every rank holds all heads and T/P tokens):
  forward   r = 0      : one pass from a zero state gives (o_0, S_out_0); S_out_0 goes to rank 1.
            0 < r < P-1: summary (M_r, S_ext_r) at once (no wait), then receive S_in, send
                         S_out = M_r·S_in + S_ext_r, then the shard's pass with initial_state=S_in
                         (the send overlaps this pass).
            r = P-1    : no summary (nobody needs its end state); receive S_in, run its pass.
  backward  each rank runs its pass's backward (giving G_r = ∂L/∂S_in|local) at once; then the
            reverse chain: receive A_{r+1} = total ∂L/∂S_out, send A_r = G_r + M_rᵀ·A_{r+1} to
            r−1, and hand dM_r = A_{r+1}·S_inᵀ, dS_ext_r = A_{r+1} to the summary's backward.
The critical path is two shard passes plus P−1 small hops each way; the chain's matmuls and
messages are in fp32 (fp64 for fp64 inputs). With the Triton core (`CPConfig.early_state`, on by
default) rank 0 sends its end state as soon as its state pass has it, before its output stage,
and ranks >= 1 run their reverse-chain step as soon as their reverse state pass has G_r, before
their input-gradient stages: the shard passes on the critical path shrink to those state passes
wherever the chain waits on them.

Packed sequences (`segments`: this shard's local sequence offsets; `continues`: whether its first
token continues a sequence of the previous rank): the chain carries the state of the sequence
that crosses each boundary. A shard that is one segment continuing a sequence keeps the summary
above; any other shard's end state is its last segment's final state from zero (M = 0, no wait);
a shard that starts a sequence multiplies the state it receives by zero (the chain, forward and
backward, stays the same on every rank). Every segment gets its own initial state in the
shard's pass (the received one for the first, zero for the others).

AllGather (eager): every rank computes its summary, all ranks gather all summaries and fold the
prefix locally; the gather's backward is an all-reduce of the summary gradients.
"""

from __future__ import annotations

import torch

from gdn.cp.comm import PendingSend, all_gather, recv_checked, send_checked, wait_sends
from gdn.cp.config import CPConfig
from gdn.cp.summary import apply_transition, merge_prefix, state_dtype, state_summary
from gdn.device import autocast_off
from gdn.ops import gated_delta_rule


class _BackwardChain:
    """The reverse-chain step of ranks 1..P-1, run once per backward: receive A_{r+1} (unless last),
    send A_r = G_r + M_rᵀ·A_{r+1} to r−1, keep (dM_r, dS_ext_r) for the summary's backward.

    With the Triton core it runs from the core's backward as soon as the reverse state pass has
    G_r = ∂L/∂S_in (S_in feeds nothing but the shard's pass), so the chain moves on while this
    rank computes its input gradients; otherwise from `_ChainHop.backward`.
    """

    def __init__(self, cp: CPConfig, has_next: bool) -> None:
        self.cp, self.has_next = cp, has_next
        self.m: torch.Tensor | None = None
        self.s_in: torch.Tensor | None = None
        self.result: tuple[torch.Tensor | None, torch.Tensor | None] | None = None
        self.sent: PendingSend | None = None

    def run(self, g_in: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.result is None:
            cp, a = self.cp, g_in.contiguous()
            d_m = d_ext = None
            if self.has_next:
                a_next = recv_checked(a, cp, cp.rank + 1, "state_bwd")
                with autocast_off(a.device):  # fp32 chain, as in the forward's apply_transition
                    a = a + self.m.transpose(-1, -2) @ a_next  # type: ignore[union-attr]
                    d_m = a_next @ self.s_in.transpose(-1, -2)  # type: ignore[union-attr]
                d_ext = a_next
            self.sent = send_checked(a, cp, cp.rank - 1, "state_bwd")
            self.result = (d_m, d_ext)
        return self.result

    def on_state_grad(self, g_in: torch.Tensor) -> None:
        self.run(g_in)


class _ChainHop(torch.autograd.Function):
    """Ranks 1..P-1: (M, S_ext | None, anchor) -> S_in received from the previous rank.

    `anchor` is any input that requires grad (g): it keeps the node in the graph on the last rank,
    which has no summary but must still send its state gradient backwards.
    """

    @staticmethod
    def forward(ctx, m, ext, anchor, chain: _BackwardChain, like: torch.Tensor, pending, pending_bwd):  # type: ignore[override]
        cp = chain.cp
        s_in = recv_checked(like, cp, cp.rank - 1, "state_fwd")
        if chain.has_next:
            pending.append(send_checked(apply_transition(m, s_in, ext), cp, cp.rank + 1, "state_fwd"))
            chain.m, chain.s_in = m.detach(), s_in  # what the reverse step multiplies with
        ctx.chain, ctx.pending_bwd = chain, pending_bwd
        return s_in

    @staticmethod
    def backward(ctx, g_in: torch.Tensor):  # type: ignore[override]
        chain: _BackwardChain = ctx.chain
        d_m, d_ext = chain.run(g_in)  # already done when the core's backward ran it early
        sent, chain.sent = chain.sent, None
        if sent is not None:
            if ctx.pending_bwd is None:
                wait_sends([sent], chain.cp)
            else:  # the caller waits later (the layer: in the halo backward), past the summary backward
                ctx.pending_bwd.append(sent)
        return d_m, d_ext, None, None, None, None, None


class _ChainHead(torch.autograd.Function):
    """Rank 0: (o, S_out) -> o; sends S_out to rank 1, and in backward receives its gradient."""

    @staticmethod
    def forward(ctx, o, s_out, cp: CPConfig, pending: list[PendingSend], send: bool):  # type: ignore[override]
        ctx.cp = cp
        if send:  # not yet sent by the core as soon as its state pass had it
            pending.append(send_checked(s_out, cp, 1, "state_fwd"))
        ctx.meta = (s_out.shape, s_out.dtype, s_out.device)
        return o.view_as(o)

    @staticmethod
    def backward(ctx, d_o: torch.Tensor):  # type: ignore[override]
        shape, dtype, device = ctx.meta
        d_s_out = recv_checked(torch.empty(shape, dtype=dtype, device=device), ctx.cp, 1, "state_bwd")
        return d_o, d_s_out, None, None, None


def p2p_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cp: CPConfig,
    *,
    backend: str = "eager",
    chunk_size: int = 64,
    pending: list[PendingSend] | None = None,
    pending_bwd: list[PendingSend] | None = None,
    segments: list[int] | None = None,
    continues: bool = True,
) -> torch.Tensor:
    """The gated delta rule over a sequence sharded on the CP group, states passed rank to rank.

    Inputs are this rank's shard ([B, T_local, H, D], [B, T_local, Hv]); returns its output.
    `pending`/`pending_bwd` collect forward/backward sends in flight; when omitted they are waited
    before return (forward) or at the end of this call's backward. `segments` (B = 1): the local
    offsets [0, ..., T_local] of the packed sequences in this shard, `continues`: whether the
    first one began on an earlier rank (the module docstring).
    """
    if segments is not None:
        return _p2p_packed(q, k, v, g, beta, cp, backend, chunk_size, pending, pending_bwd, segments,
                           continues)
    size, rank = cp.world_size, cp.rank
    if size == 1:
        o, _ = gated_delta_rule(q, k, v, g, beta, backend=backend, chunk_size=chunk_size)  # type: ignore[arg-type]
        return o
    own_pending = pending is None
    pending = [] if pending is None else pending
    B, _, Hv, dv = v.shape
    dk = k.shape[-1]
    early = cp.early_state and backend == "triton"
    if rank == 0:
        sent: list[PendingSend] = []

        def send_end_state(ht: torch.Tensor) -> None:
            sent.append(send_checked(ht, cp, 1, "state_fwd"))

        o, s_out = gated_delta_rule(
            q, k, v, g, beta,
            output_final_state=True, backend=backend, chunk_size=chunk_size,  # type: ignore[arg-type]
            on_final_state=send_end_state if early else None,
        )
        pending.extend(sent)
        o = _ChainHead.apply(o, s_out, cp, pending, not sent)
    else:
        m = ext = None
        if rank + 1 < size:
            m, ext = state_summary(q, k, v, g, beta, backend=backend, chunk_size=chunk_size)
        like = torch.empty(B, Hv, dk, dv, dtype=state_dtype(v), device=v.device)
        chain = _BackwardChain(cp, has_next=rank + 1 < size)
        s_in = _ChainHop.apply(m, ext, g, chain, like, pending, pending_bwd)
        o, _ = gated_delta_rule(
            q, k, v, g, beta,
            initial_state=s_in, backend=backend, chunk_size=chunk_size,  # type: ignore[arg-type]
            on_initial_state_grad=chain.on_state_grad if early else None,
        )
    if own_pending:
        wait_sends(pending, cp)
    return o


def _p2p_packed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cp: CPConfig,
    backend: str, chunk_size: int, pending: list[PendingSend] | None, pending_bwd: list[PendingSend] | None,
    segments: list[int], continues: bool,
) -> torch.Tensor:
    """P2P over packed sequences (see the module docstring); no early-state hooks."""
    size, rank = cp.world_size, cp.rank
    own_pending = pending is None
    pending = [] if pending is None else pending
    _, _, Hv, dv = v.shape
    dk, n, sdt = k.shape[-1], len(segments) - 1, state_dtype(v)
    cu = torch.tensor(segments, dtype=torch.int32, device=v.device) if n > 1 else None
    kw = {"backend": backend, "chunk_size": chunk_size}
    if rank == 0:  # its first token starts a sequence: every segment from zero
        o, finals = gated_delta_rule(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu, **kw)  # type: ignore[arg-type]
        o = _ChainHead.apply(o, finals[-1:], cp, pending, True)
    else:
        m = ext = None
        if rank + 1 < size:
            if n == 1 and continues:  # the whole shard is one sequence's middle: its summary
                m, ext = state_summary(q, k, v, g, beta, backend=backend, chunk_size=chunk_size)
            else:  # the end state is the last segment's, whatever arrives
                a = segments[-2]
                _, ext = gated_delta_rule(q[:, a:], k[:, a:], v[:, a:], g[:, a:], beta[:, a:],
                                          output_final_state=True, **kw)  # type: ignore[arg-type]
                m = torch.zeros(1, Hv, dk, dk, dtype=sdt, device=v.device)
        like = torch.empty(1, Hv, dk, dv, dtype=sdt, device=v.device)
        chain = _BackwardChain(cp, has_next=rank + 1 < size)
        s_in = _ChainHop.apply(m, ext, g, chain, like, pending, pending_bwd)
        first = s_in if continues else s_in * 0.0  # kept in the graph: its gradient (zero) goes back
        h0 = torch.cat([first, first.new_zeros(n - 1, Hv, dk, dv)]) if n > 1 else first
        o, _ = gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, **kw)  # type: ignore[arg-type]
    if own_pending:
        wait_sends(pending, cp)
    return o


def all_gather_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cp: CPConfig,
    *,
    backend: str = "eager",
    chunk_size: int = 64,
) -> torch.Tensor:
    """AllGather CP: gather every shard's (M, S_ext), fold the prefix locally, run this shard."""
    cp.check_backend(backend)
    size, rank = cp.world_size, cp.rank
    if size == 1:
        o, _ = gated_delta_rule(q, k, v, g, beta, backend=backend, chunk_size=chunk_size)  # type: ignore[arg-type]
        return o
    B, _, Hv, dv = v.shape
    dk = k.shape[-1]
    sdt = state_dtype(v)
    if rank + 1 < size:
        m, ext = state_summary(
            q, k, v, g, beta, backend=backend, chunk_size=chunk_size, need_transition=rank > 0
        )
        if m is None:  # rank 0: nobody folds M_0 (S_in of rank 0 is zero)
            m = ext.new_zeros(B, Hv, dk, dk)
    else:  # the last shard's summary is never used; contribute zeros
        m = torch.zeros(B, Hv, dk, dk, dtype=sdt, device=v.device)
        ext = torch.zeros(B, Hv, dk, dv, dtype=sdt, device=v.device)
    gathered = all_gather(torch.cat([m, ext], dim=-1), cp, g)  # [P, B, Hv, dk, dk+dv]
    if rank == 0:
        # Keep the gather in rank 0's graph (zero gradient) so its backward all-reduce runs here too.
        s_in = torch.zeros(B, Hv, dk, dv, dtype=sdt, device=v.device) + 0.0 * gathered.sum()
    else:
        ms = [gathered[j, ..., :dk] for j in range(rank)]
        exts = [gathered[j, ..., dk:] for j in range(rank)]
        s_in = merge_prefix(ms, exts)
    o, _ = gated_delta_rule(q, k, v, g, beta, initial_state=s_in, backend=backend, chunk_size=chunk_size)  # type: ignore[arg-type]
    return o
