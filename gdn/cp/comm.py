"""CP communication: checked point-to-point messages, the Conv1D halo, all-to-all and all-gather.

Every point-to-point message carries a 16-byte header (channel sequence number, sender rank), so a
receiver detects a message that arrives out of order instead of silently mixing states: each
(kind, peer) channel is numbered on both ends by `CPStats.next_seq`, and all ranks issue their
messages in the same program order. Every wait uses the config's timeout, so a missing peer
becomes a `CPCommError` naming the transfer, not a hang.

Tags keep kinds apart on backends that honour them (gloo); NCCL matches point-to-point messages
by posting order, which our program order keeps consistent (halo before state in forward, state
gradient before halo gradient in backward, on both ends of every pair).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gdn import collectives
from gdn.cp.config import CPCommError, CPConfig, CPError

TAGS: dict[str, int] = {"halo_fwd": 11, "halo_bwd": 12, "state_fwd": 21, "state_bwd": 22}
_HEADER_BYTES = 16


def _wait(work: dist.Work, cp: CPConfig, what: str) -> None:
    """Bounded by the config's timeout on every backend (HCCL: by polling, see gdn.collectives)."""
    try:
        collectives.wait(work, cp.timeout, what, cp.group)
    except collectives.CollectiveTimeout as exc:  # a timeout or a peer failure
        raise CPCommError(f"{what} failed or timed out after {cp.timeout}: {exc}") from exc


def _pack(t: torch.Tensor, seq: int, sender: int) -> torch.Tensor:
    header = torch.tensor([seq, sender], dtype=torch.int64, device=t.device).view(torch.uint8)
    return torch.cat([t.contiguous().view(-1).view(torch.uint8), header])


@dataclass
class PendingSend:
    """An isend in flight; its buffer stays referenced until `wait`."""

    work: dist.Work
    buffer: torch.Tensor
    what: str


def send_checked(t: torch.Tensor, cp: CPConfig, dst: int, kind: str) -> PendingSend:
    """Start sending `t` to group rank `dst`; the caller waits on the result later (overlap)."""
    seq = cp.stats.next_seq(kind, "send", dst)
    buf = _pack(t, seq, cp.rank)
    what = f"{kind} send #{seq} from rank {cp.rank} to rank {dst}"
    work = collectives.isend(buf, cp.global_rank(dst), cp.group, TAGS[kind], what)
    cp.stats.sent[kind] = cp.stats.sent.get(kind, 0) + 1
    sent = PendingSend(work, buf, what)
    cp.inflight.append(sent)
    return sent


def wait_sends(pending: list[PendingSend], cp: CPConfig) -> None:
    """Wait for the given sends (and forget them)."""
    while pending:
        p = pending.pop()
        _wait(p.work, cp, p.what)
        if p in cp.inflight:
            cp.inflight.remove(p)


def drain_sends(cp: CPConfig) -> None:
    """Wait for every send this config still has in flight (also those of a cut-short forward)."""
    wait_sends(list(cp.inflight), cp)


def recv_checked(like: torch.Tensor, cp: CPConfig, src: int, kind: str) -> torch.Tensor:
    """Receive a tensor shaped and typed like `like` from group rank `src`; check its sequence number."""
    seq = cp.stats.next_seq(kind, "recv", src)
    nbytes = like.numel() * like.element_size()
    buf = torch.empty(nbytes + _HEADER_BYTES, dtype=torch.uint8, device=like.device)
    what = f"{kind} recv #{seq} on rank {cp.rank} from rank {src}"
    start = time.perf_counter()
    work = collectives.irecv(buf, cp.global_rank(src), cp.group, TAGS[kind], what)
    _wait(work, cp, what)
    cp.stats.wait_ms[kind] = cp.stats.wait_ms.get(kind, 0.0) + (time.perf_counter() - start) * 1e3
    got_seq, sender = buf[nbytes:].view(torch.int64).tolist()
    if got_seq != seq or sender != src:
        raise CPCommError(
            f"CP order mismatch on rank {cp.rank}: expected {kind} message #{seq} from rank {src}, "
            f"got #{got_seq} from rank {sender}"
        )
    cp.stats.order_checks += 1
    cp.stats.received[kind] = cp.stats.received.get(kind, 0) + 1
    return buf[:nbytes].view(like.dtype).view(like.shape).clone()


# ---------------------------------------------------------------------------------------------
# Conv1D halo


class _Halo(torch.autograd.Function):
    """x_local [B, T_local, C] -> the previous rank's last `width` tokens [B, width, C] (zeros on rank 0).

    Backward returns the halo's gradient to the rank that owns those tokens.
    """

    @staticmethod
    def forward(ctx, x, cp: CPConfig, width: int, pending_fwd, pending_bwd):  # type: ignore[override]
        ctx.cp, ctx.width, ctx.pending_bwd, ctx.T = cp, width, pending_bwd, x.shape[1]
        rank, size = cp.rank, cp.world_size
        tail = x[:, -width:].contiguous()
        if rank + 1 < size:
            pending_fwd.append(send_checked(tail, cp, rank + 1, "halo_fwd"))
        if rank > 0:
            return recv_checked(tail, cp, rank - 1, "halo_fwd")
        return torch.zeros_like(tail)

    @staticmethod
    def backward(ctx, d_halo: torch.Tensor):  # type: ignore[override]
        cp, width = ctx.cp, ctx.width
        rank, size = cp.rank, cp.world_size
        d_halo = d_halo.contiguous()
        sends: list[PendingSend] = []
        if rank > 0:
            sends.append(send_checked(d_halo, cp, rank - 1, "halo_bwd"))
        B, _, C = d_halo.shape
        dx = d_halo.new_zeros(B, ctx.T, C)
        if rank + 1 < size:
            dx[:, -width:] = recv_checked(d_halo, cp, rank + 1, "halo_bwd")
        # This backward's send, and those the state chain left in flight, finish here: the halo
        # is the layer's last CP op in backward on every rank.
        wait_sends(sends, cp)
        wait_sends(ctx.pending_bwd, cp)
        drain_sends(cp)
        return dx, None, None, None, None


def conv_halo(
    x: torch.Tensor, cp: CPConfig, width: int, pending_fwd: list[PendingSend], pending_bwd: list[PendingSend]
) -> torch.Tensor:
    """The `width` tokens before this rank's shard, from the previous rank (differentiable).

    The forward send goes to `pending_fwd` (the caller waits after its compute: overlap); the
    backward waits for the sends that later ops of the layer put in `pending_bwd`.
    """
    if x.shape[1] < width:
        raise CPError(
            f"local sequence length {x.shape[1]} is shorter than the Conv1D halo {width} "
            f"(conv_size - 1); each CP rank needs at least {width} tokens"
        )
    return _Halo.apply(x, cp, width, pending_fwd, pending_bwd)


# ---------------------------------------------------------------------------------------------
# Ulysses all-to-all


def _all_to_all(x: torch.Tensor, cp: CPConfig, what: str) -> torch.Tensor:
    """all_to_all_single along dim 0 (P equal slots) with the config's timeout."""
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, unlike empty_like(view)
    work = collectives.all_to_all_single(out, x, cp.group, what, async_op=True)
    _wait(work, cp, what)
    return out


class _SeqToHead(torch.autograd.Function):
    """[B, T_local, P, F] (slot p goes to rank p) -> [B, P·T_local, F] (this rank's heads, all tokens)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cp: CPConfig):  # type: ignore[override]
        ctx.cp = cp
        return _seq_to_head_raw(x, cp)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        return _head_to_seq_raw(dy, ctx.cp), None


def _head_to_seq_raw(y: torch.Tensor, cp: CPConfig) -> torch.Tensor:
    B, T, F = y.shape
    P = cp.world_size
    out = _all_to_all(
        y.view(B, P, T // P, F).permute(1, 0, 2, 3), cp, "ulysses all-to-all (heads -> sequence)"
    )
    return out.permute(1, 2, 0, 3)  # [B, T_local, P, F]


def _seq_to_head_raw(x: torch.Tensor, cp: CPConfig) -> torch.Tensor:
    B, Tl, P, F = x.shape
    out = _all_to_all(x.permute(2, 0, 1, 3), cp, "ulysses all-to-all (sequence -> heads)")
    return out.permute(1, 0, 2, 3).reshape(B, P * Tl, F)


class _HeadToSeq(torch.autograd.Function):
    """[B, T, F] (this rank's heads) -> [B, T_local, P, F] (slot p = rank p's heads, local tokens)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, cp: CPConfig):  # type: ignore[override]
        ctx.cp = cp
        return _head_to_seq_raw(y, cp)

    @staticmethod
    def backward(ctx, dx: torch.Tensor):  # type: ignore[override]
        return _seq_to_head_raw(dx, ctx.cp), None


def seq_to_head(x: torch.Tensor, cp: CPConfig) -> torch.Tensor:
    """Differentiable Ulysses all-to-all: [B, T_local, P, F] -> [B, T, F]."""
    if x.shape[2] != cp.world_size:
        raise CPError(f"seq_to_head expects {cp.world_size} head slots in dim 2, got shape {tuple(x.shape)}")
    return _SeqToHead.apply(x, cp)


def head_to_seq(y: torch.Tensor, cp: CPConfig) -> torch.Tensor:
    """Differentiable inverse of `seq_to_head`: [B, T, F] -> [B, T_local, P, F]."""
    if y.shape[1] % cp.world_size:
        raise CPError(f"head_to_seq: length {y.shape[1]} is not divisible by the CP size {cp.world_size}")
    return _HeadToSeq.apply(y, cp)


# ---------------------------------------------------------------------------------------------
# All-gather


def all_gather_nograd(x: torch.Tensor, cp: CPConfig, what: str) -> torch.Tensor:
    """[...] -> [P, ...] of every rank's `x` (no autograd)."""
    out = x.new_empty(cp.world_size * x.numel())  # flat: what every backend accepts
    work = collectives.all_gather_into(out, x.contiguous().view(-1), cp.group, what, async_op=True)
    _wait(work, cp, what)
    return out.view(cp.world_size, *x.shape)


class _AllGather(torch.autograd.Function):
    """[...] -> [P, ...]; backward sums every rank's gradient of slot r and returns it to rank r.

    `anchor` (any tensor that requires grad) keeps the node, and so the backward all-reduce, on a
    rank whose own contribution is a constant.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, anchor: torch.Tensor, cp: CPConfig):  # type: ignore[override]
        ctx.cp = cp
        return all_gather_nograd(x, cp, "all_gather of shard summaries")

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        cp = ctx.cp
        what = "sum of shard-summary gradients"
        try:
            dy = collectives.sum_over(dy.contiguous(), cp.group, what, timeout=cp.timeout)
        except collectives.CollectiveTimeout as exc:
            raise CPCommError(f"{what} failed or timed out after {cp.timeout}: {exc}") from exc
        return dy[cp.rank], None, None


def all_gather(x: torch.Tensor, cp: CPConfig, anchor: torch.Tensor) -> torch.Tensor:
    """Differentiable all-gather along a new leading dim of size P (`anchor`: see `_AllGather`)."""
    return _AllGather.apply(x, anchor, cp)


def check_same_shape(shape: tuple[int, ...], cp: CPConfig, what: str, device: torch.device) -> None:
    """Raise `CPError` naming each rank's shape when the ranks of the group disagree (one small gather).

    `device` is where the group's backend takes tensors (the layer's device; CPU for gloo).
    """
    if dist.get_backend(cp.group) == "gloo":
        device = torch.device("cpu")
    t = torch.tensor(shape, dtype=torch.int64, device=device)
    shapes = all_gather_nograd(t, cp, f"shape check of {what}").cpu().tolist()
    if any(s != shapes[0] for s in shapes):
        listing = ", ".join(f"rank {r}: {tuple(s)}" for r, s in enumerate(shapes))
        raise CPError(f"CP ranks disagree on the shape of {what}; every rank must hold the same: {listing}")
