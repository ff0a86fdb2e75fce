"""The Qwen3.5-style GatedDeltaNet layer (linear-attention mixer), with context parallelism.

x -> in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
  -> causal depthwise Conv1D (k = conv_size) over q|k|v, SiLU -> l2-normalised q, k
  -> beta = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias)
  -> gated delta rule (Hqk q/k heads serve Hv value heads natively)
  -> gated RMSNorm: rmsnorm(o)·weight·silu(z), fp32 inside -> out_proj.

Parameters are full on every rank (FSDP may shard them outside). Padding (mask 0) zeroes the
token's q|k|v before the conv and its beta and g (so the state passes unchanged: exp(0)·(I − 0)),
and its output is exactly zero. A packed batch (`cu_seqlens`, B = 1, offsets over the global T)
restarts the conv and the core at every sequence start: each sequence's output is the layer's
output for that sequence alone. CP modes (see `gdn.cp`):
  none       : the whole sequence on one rank;
  ulysses    : all-to-all to head shards before the conv (conv weights, A_log and dt_bias are
               sliced to the local heads; no halo), all-to-all back after the core;
  p2p        : sequence shards, Conv1D halo from the previous rank, state chain rank -> rank;
  all_gather : sequence shards, halo, every rank gathers all shard summaries (eager only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from gdn.backends import get_backend
from gdn.conv import causal_depthwise_conv1d, compute_dtype
from gdn.cp.comm import (
    PendingSend,
    check_same_shape,
    conv_halo,
    drain_sends,
    head_to_seq,
    seq_to_head,
    wait_sends,
)
from gdn.cp.config import CPConfig, CPError, packed_shard_misfit, ulysses_misfit
from gdn.cp.p2p import all_gather_gated_delta_rule, p2p_gated_delta_rule
from gdn.ops import gated_delta_rule
from gdn.packing import check_cu_seqlens, shard_segments

L2NORM_EPS = 1e-6


@dataclass
class GDNLayerConfig:
    hidden_size: int = 2048
    num_qk_heads: int = 16
    num_v_heads: int = 32
    head_dim: int = 128
    conv_size: int = 4
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_qk_heads", "num_v_heads", "head_dim", "conv_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"GDNLayerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_v_heads % self.num_qk_heads:
            raise ValueError(
                f"num_v_heads={self.num_v_heads} must be a multiple of num_qk_heads={self.num_qk_heads}"
            )

    @property
    def key_dim(self) -> int:
        return self.num_qk_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


def l2_normalize(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    xf = x.to(compute_dtype(x))
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """rmsnorm(x)·weight·silu(z) over the last dim, computed in fp32 (fp64 for fp64 inputs)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        cdt = compute_dtype(x)
        xf = x.to(cdt)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.to(cdt) * F.silu(z.to(cdt))).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """Qwen3.5-style GatedDeltaNet mixer; `forward(x [B, T_local, hidden], mask [B, T_local] | None)`."""

    def __init__(
        self,
        config: GDNLayerConfig,
        *,
        backend: str = "eager",
        cp: CPConfig | None = None,
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        get_backend(backend)  # an unknown name fails here, naming the registered ones
        self.config = config
        self.backend = backend
        self.chunk_size = chunk_size
        self.cp = cp if cp is not None else CPConfig("none")
        self.cp.check_backend(backend)
        c = config
        if self.cp.mode == "ulysses":
            misfit = ulysses_misfit(c.num_qk_heads, c.num_v_heads, self.cp.world_size)
            if misfit is not None:
                raise CPError(misfit)
        self.in_proj_qkv = nn.Linear(c.hidden_size, c.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, c.value_dim, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(
            c.conv_dim, c.conv_dim, kernel_size=c.conv_size, groups=c.conv_dim, bias=False,
            padding=c.conv_size - 1,
        )
        self.A_log = nn.Parameter(torch.empty(c.num_v_heads))
        self.dt_bias = nn.Parameter(torch.empty(c.num_v_heads))
        self.norm = GatedRMSNorm(c.head_dim, eps=c.norm_eps)
        self.out_proj = nn.Linear(c.value_dim, c.hidden_size, bias=False)
        self._checked_shapes: set[tuple[int, ...]] = set()
        self.reset_gdn_parameters()

    @torch.no_grad()
    def reset_gdn_parameters(self) -> None:
        """Qwen3.5's choices: A = U(1, 16) in log space, dt_bias = 1, norm weight = 1."""
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1.0, 16.0).log())
        self.dt_bias.fill_(1.0)
        self.norm.weight.fill_(1.0)

    # ------------------------------------------------------------------ pieces (also used by emulation)

    def check_input(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        """Validate shapes; returns the mask as [B, T_local, 1] in x's dtype (or None)."""
        if x.dim() != 3 or x.shape[-1] != self.config.hidden_size:
            raise ValueError(
                f"x must be [B, T_local, hidden={self.config.hidden_size}], got shape {tuple(x.shape)}"
            )
        if mask is None:
            return None
        if tuple(mask.shape) != tuple(x.shape[:2]):
            raise ValueError(
                f"mask must be [B, T_local]={list(x.shape[:2])} (1 = valid token), "
                f"got shape {tuple(mask.shape)}"
            )
        if mask.dtype != torch.bool and ((mask != 0) & (mask != 1)).any():
            raise ValueError("mask must hold only 0 (padding) and 1 (valid)")
        return mask.to(device=x.device, dtype=x.dtype).unsqueeze(-1)

    def project(self, x: torch.Tensor, m: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """(q|k|v before the conv, zeroed at padding; z; b; a)."""
        qkv = self.in_proj_qkv(x)
        if m is not None:
            qkv = qkv * m
        return qkv, self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)

    def conv(
        self, qkv: torch.Tensor, halo: torch.Tensor | None, channels: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Causal depthwise conv + SiLU over [B, T, C]; `halo` = the K-1 tokens before (zeros if None).

        `channels` selects the conv weights of a head shard (Ulysses).
        """
        w = self.conv1d.weight if channels is None else self.conv1d.weight.index_select(0, channels)
        width = self.config.conv_size - 1
        if halo is None:
            halo = qkv.new_zeros(qkv.shape[0], width, qkv.shape[2])
        return F.silu(causal_depthwise_conv1d(torch.cat([halo, qkv], dim=1), w))

    def gates(
        self, b: torch.Tensor, a: torch.Tensor, m: torch.Tensor | None, heads: slice | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(g, beta) for [B, T, h] pre-activations; `heads` slices A_log/dt_bias (Ulysses)."""
        cdt = compute_dtype(a)
        A_log = self.A_log if heads is None else self.A_log[heads]
        dt_bias = self.dt_bias if heads is None else self.dt_bias[heads]
        g = -A_log.to(cdt).exp() * F.softplus(a.to(cdt) + dt_bias.to(cdt))
        beta = torch.sigmoid(b)
        if m is not None:
            g = g * m.to(cdt)
            beta = beta * m
        return g, beta

    def split_qkv(self, y: torch.Tensor, hq: int, hv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = y.shape
        D = self.config.head_dim
        q, k, v = torch.split(y, [hq * D, hq * D, hv * D], dim=-1)
        return (
            l2_normalize(q.reshape(B, T, hq, D)),
            l2_normalize(k.reshape(B, T, hq, D)),
            v.reshape(B, T, hv, D),
        )

    def finish(self, o: torch.Tensor, z: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        """Gated RMSNorm per head, output projection, exact zeros at padding."""
        B, T = o.shape[:2]
        D = self.config.head_dim
        y = self.norm(o, z.reshape(B, T, -1, D)).reshape(B, T, -1)
        out = self.out_proj(y)
        return out if m is None else out * m

    def packed_conv(
        self, qkv: torch.Tensor, cu: list[int] | None, channels: torch.Tensor | None = None,
        halo: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`conv` restarted at every packed sequence (`cu`: offsets; None: one sequence), so no
        sequence sees the tokens of the one before it; `halo` goes before the first one only."""
        if cu is None or len(cu) == 2:
            return self.conv(qkv, halo, channels)
        return torch.cat([self.conv(qkv[:, a:b], halo if a == 0 else None, channels)
                          for a, b in pairwise(cu)], dim=1)

    def shard_conv(
        self, qkv: torch.Tensor, halo: torch.Tensor | None, cu: list[int] | None, lo: int
    ) -> torch.Tensor:
        """`conv` of a sequence shard that starts at global token `lo`, after `halo` (its K-1
        tokens before; None: zeros). Packed (`cu`: offsets over the global T), the halo keeps
        only tokens of the sequence holding token lo and the conv restarts at every sequence
        start inside the shard."""
        if cu is None:
            return self.conv(qkv, halo)
        segments, _, start = shard_segments(cu, lo, qkv.shape[1])
        if halo is not None:
            keep = torch.arange(lo - halo.shape[1], lo, device=qkv.device) >= start
            halo = halo * keep.to(halo.dtype)[None, :, None]
        return self.packed_conv(qkv, segments, None, halo)

    def core(
        self, q, k, v, g, beta, *, initial_state: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        o, _ = gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            initial_state=initial_state,
            cu_seqlens=cu_seqlens,
            backend=self.backend,
            chunk_size=self.chunk_size,  # type: ignore[arg-type]
        )
        return o

    # ------------------------------------------------------------------ forward

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [B, T_local, hidden]; `cu_seqlens`: N+1 offsets of packed sequences over the global T
        (B = 1, the same tensor on every rank), or None."""
        m = self.check_input(x, mask)
        cp = self.cp
        cu = None
        if cu_seqlens is not None:
            cu = check_cu_seqlens(cu_seqlens, batch=x.shape[0], seq_len=x.shape[1] * cp.world_size)
        if not cp.enabled:
            return self._forward_local(x, m, cu)
        misfit = None
        if cu is not None and cp.mode != "ulysses":
            misfit = packed_shard_misfit(cu, x.shape[1], cp.world_size, cp.mode)
            if misfit is not None and cp.mode != "p2p":
                raise CPError(misfit)
        drain_sends(cp)  # anything a cut-short (recomputed) forward left in flight
        key = tuple(x.shape)
        if key not in self._checked_shapes:  # once per shape: ranks must hold equal shards
            check_same_shape(key, cp, "the layer input [B, T_local, hidden]", x.device)
            self._checked_shapes.add(key)
        if cp.mode == "ulysses":
            return self._forward_ulysses(x, m, cu)
        if cu is not None and misfit is None:  # every shard holds whole sequences: nothing crosses
            return self._forward_local(x, m, shard_segments(cu, cp.rank * x.shape[1], x.shape[1])[0])
        return self._forward_sequence_sharded(x, m, cu)

    def _forward_local(
        self, x: torch.Tensor, m: torch.Tensor | None, cu: list[int] | None = None
    ) -> torch.Tensor:
        c = self.config
        qkv, z, b, a = self.project(x, m)
        q, k, v = self.split_qkv(self.packed_conv(qkv, cu), c.num_qk_heads, c.num_v_heads)
        g, beta = self.gates(b, a, m)
        return self.finish(self.core(q, k, v, g, beta, cu_seqlens=_offsets(cu, x.device)), z, m)

    def _forward_sequence_sharded(
        self, x: torch.Tensor, m: torch.Tensor | None, cu: list[int] | None = None
    ) -> torch.Tensor:
        c, cp = self.config, self.cp
        pending: list[PendingSend] = []
        pending_bwd: list[PendingSend] = []
        qkv, z, b, a = self.project(x, m)
        width = c.conv_size - 1
        halo = conv_halo(qkv, cp, width, pending, pending_bwd)
        lo = cp.rank * x.shape[1]
        segments, continues = None, True
        if cu is not None:  # packed, a sequence crosses a boundary (P2P): see p2p_gated_delta_rule
            segments, continues, _ = shard_segments(cu, lo, x.shape[1])
        q, k, v = self.split_qkv(self.shard_conv(qkv, halo, cu, lo), c.num_qk_heads, c.num_v_heads)
        g, beta = self.gates(b, a, m)
        if cp.mode == "p2p":
            o = p2p_gated_delta_rule(
                q, k, v, g, beta, cp, backend=self.backend, chunk_size=self.chunk_size,
                pending=pending, pending_bwd=pending_bwd, segments=segments, continues=continues,
            )
        else:
            o = all_gather_gated_delta_rule(
                q, k, v, g, beta, cp, backend=self.backend, chunk_size=self.chunk_size
            )
        out = self.finish(o, z, m)
        wait_sends(pending, cp)  # the halo and state sends overlapped this rank's own pass
        return out

    def _ulysses_layout(self) -> tuple[int, int, int, torch.Tensor]:
        """(local q/k heads, local v heads, this rank, conv channel indices of its head shard)."""
        c, cp = self.config, self.cp
        P, r = cp.world_size, cp.rank
        hq, hv, D = c.num_qk_heads // P, c.num_v_heads // P, c.head_dim
        dev = self.conv1d.weight.device
        idx = torch.cat([
            torch.arange(r * hq * D, (r + 1) * hq * D, device=dev),
            c.key_dim + torch.arange(r * hq * D, (r + 1) * hq * D, device=dev),
            2 * c.key_dim + torch.arange(r * hv * D, (r + 1) * hv * D, device=dev),
        ])
        return hq, hv, r, idx

    def _forward_ulysses(
        self, x: torch.Tensor, m: torch.Tensor | None, cu: list[int] | None = None
    ) -> torch.Tensor:
        from gdn.cp.comm import all_gather_nograd

        c, cp = self.config, self.cp
        P = cp.world_size
        hq, hv, r, channels = self._ulysses_layout()
        D = c.head_dim
        B, Tl, _ = x.shape
        qkv, z, b, a = self.project(x, m)
        q, k, v = torch.split(qkv, [c.key_dim, c.key_dim, c.value_dim], dim=-1)
        packed = torch.cat(
            [q.reshape(B, Tl, P, hq * D), k.reshape(B, Tl, P, hq * D), v.reshape(B, Tl, P, hv * D),
             b.reshape(B, Tl, P, hv), a.reshape(B, Tl, P, hv)], dim=-1,
        )
        heads = seq_to_head(packed, cp)  # [B, T, F] with this rank's heads, every token
        qkv_h, b_h, a_h = torch.split(heads, [(2 * hq + hv) * D, hv, hv], dim=-1)
        m_full = None
        if m is not None:
            m_full = (
                all_gather_nograd(m, cp, "ulysses mask all_gather").permute(1, 0, 2, 3).reshape(B, P * Tl, 1)
            )
        qh, kh, vh = self.split_qkv(self.packed_conv(qkv_h, cu, channels), hq, hv)
        g, beta = self.gates(b_h, a_h, m_full, heads=slice(r * hv, (r + 1) * hv))
        o = self.core(qh, kh, vh, g, beta, cu_seqlens=_offsets(cu, x.device))  # [B, T, hv, D]
        o = head_to_seq(o.reshape(B, P * Tl, hv * D), cp).reshape(B, Tl, c.num_v_heads, D)
        return self.finish(o, z, m)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"hidden={c.hidden_size}, heads qk={c.num_qk_heads} v={c.num_v_heads}, head_dim={c.head_dim}, "
            f"conv={c.conv_size}, backend={self.backend!r}, cp={self.cp.mode!r}"
        )


def _offsets(cu: list[int] | None, device: torch.device) -> torch.Tensor | None:
    """Checked offsets as the core's `cu_seqlens` (None for a single sequence: the dense path)."""
    if cu is None or len(cu) == 2:
        return None
    return torch.tensor(cu, dtype=torch.int32, device=device)


def gdn_layer_init_(layer: GatedDeltaNet, seed: int) -> GatedDeltaNet:
    """Re-initialise every parameter from `seed` alone, so each rank builds identical weights."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "A_log":
                p.copy_(torch.empty(p.shape, dtype=torch.float64).uniform_(1.0, 16.0, generator=gen).log())
            elif name == "dt_bias":
                p.copy_(1.0 + 0.5 * torch.rand(p.shape, generator=gen, dtype=torch.float64))
            elif name == "norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / math.sqrt(fan_in))
    return layer
