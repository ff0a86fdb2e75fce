"""The hybrid Qwen3.5-style decoder the whole-network suites train (docs/benchmarks.md, Network).

Layers alternate linear attention (the GatedDeltaNet layer of `gdn.layer`) and full attention
3:1: every `full_attention_interval`-th layer is causal GQA with RoPE. Each decoder layer is
pre-norm (RMSNorm) with a SwiGLU MLP. The loss is the cross-entropy summed over this rank's valid
labels divided by the *global* valid-label count, so the per-rank losses of a CP run add up to the
single-device loss and their gradients add up to its gradient.

Context parallelism: every rank holds a contiguous slice of the same sample. The GatedDeltaNet
layers get the `CPConfig` and do their own exchange; full attention all-gathers K/V (after RoPE
with global positions) over the same group and attends with the causal diagonal shifted by the
slice's offset. The gather's backward sums every rank's contribution, so the result is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gdn import collectives
from gdn.data import IGNORE_INDEX

if TYPE_CHECKING:
    from gdn.cp import CPConfig

LAYER_TYPES: tuple[str, ...] = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the hybrid decoder. The linear-attention fields feed `gdn.layer.GDNLayerConfig`."""

    vocab_size: int = 32768
    hidden_size: int = 2048
    num_layers: int = 4
    full_attention_interval: int = 4  # layer i is full attention when (i + 1) % interval == 0
    layer_types: tuple[str, ...] | None = None  # explicit per-layer override of the 3:1 pattern
    intermediate_size: int = 6144
    # linear attention (GatedDeltaNet)
    linear_num_qk_heads: int = 16
    linear_num_v_heads: int = 32
    linear_head_dim: int = 128
    conv_size: int = 4
    # full attention
    num_attention_heads: int = 16
    num_kv_heads: int = 2
    attn_head_dim: int = 256
    rope_theta: float = 1_000_000.0
    attn_output_gate: bool = True
    norm_eps: float = 1e-6
    init_std: float = 0.02
    # N(0, 1) embeddings keep the residual stream at unit RMS, so the first RMSNorm does not
    # scale the embedding gradient by 1/init_std (a 50x spike source in small models)
    embed_init_std: float = 1.0
    tie_embeddings: bool = False
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "hidden_size", "num_layers", "intermediate_size", "full_attention_interval")
        for key in sizes:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.attn_head_dim % 2:
            raise ValueError(f"attn_head_dim must be even for RoPE, got {self.attn_head_dim}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(
                    f"layer_types has {len(self.layer_types)} entries, expected num_layers={self.num_layers}"
                )
            bad = [t for t in self.layer_types if t not in LAYER_TYPES]
            if bad:
                raise ValueError(f"unknown layer type(s) {bad}; expected {LAYER_TYPES}")

    def layer_type(self, i: int) -> str:
        if self.layer_types is not None:
            return self.layer_types[i]
        return "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"

    def layer_config(self):  # -> gdn.layer.GDNLayerConfig (imported lazily)
        from gdn.layer import GDNLayerConfig

        return GDNLayerConfig(
            hidden_size=self.hidden_size,
            num_qk_heads=self.linear_num_qk_heads,
            num_v_heads=self.linear_num_v_heads,
            head_dim=self.linear_head_dim,
            conv_size=self.conv_size,
            norm_eps=self.norm_eps,
        )


# The report's 4- and 8-layer networks (hidden 2048, the layer defaults) and tiny CPU configs.
# Vocabulary: the byte-level stream uses ids < 257; 32768 keeps the lm_head at the size of a
# small real tokenizer so its cost is represented in the timings.
MODEL_CONFIGS: dict[str, ModelConfig] = {
    "qwen35-4l": ModelConfig(num_layers=4, name="qwen35-4l"),
    "qwen35-8l": ModelConfig(num_layers=8, name="qwen35-8l"),
    "tiny": ModelConfig(
        vocab_size=264, hidden_size=64, num_layers=4, intermediate_size=128,
        linear_num_qk_heads=2, linear_num_v_heads=4, linear_head_dim=16,
        num_attention_heads=4, num_kv_heads=2, attn_head_dim=16, name="tiny",
    ),
    "tiny-8l": ModelConfig(
        vocab_size=264, hidden_size=64, num_layers=8, intermediate_size=128,
        linear_num_qk_heads=2, linear_num_v_heads=4, linear_head_dim=16,
        num_attention_heads=4, num_kv_heads=2, attn_head_dim=16, name="tiny-8l",
    ),
    # the report's head layout (16/32 heads of 128, conv 4) at a small hidden size: for the
    # Triton backend, which needs head_dim 128, on a small device or under the interpreter
    "small-128": ModelConfig(
        vocab_size=264, hidden_size=256, num_layers=4, intermediate_size=512,
        linear_num_qk_heads=2, linear_num_v_heads=4, linear_head_dim=128,
        num_attention_heads=2, num_kv_heads=1, attn_head_dim=128, name="small-128",
    ),
}


def model_config(name: str, **overrides: object) -> ModelConfig:
    """A named config with field overrides; raises naming the known configs."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model config {name!r}; expected one of {sorted(MODEL_CONFIGS)}")
    return replace(MODEL_CONFIGS[name], **overrides)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# CP helpers


def cp_active(cp: CPConfig | None) -> bool:
    """True when `cp` really splits the sequence over more than one rank."""
    return cp is not None and cp.enabled


def cp_rank_size(cp: CPConfig | None) -> tuple[int, int]:
    """(rank, size) in the CP group; (0, 1) without CP. `cp.group` None is the default group."""
    if not cp_active(cp):
        return 0, 1
    return cp.rank, cp.world_size  # type: ignore[union-attr]


class _GatherSequence(torch.autograd.Function):
    """All-gather along `dim` in rank order; backward sums the gradient of the gathered tensor
    over ranks (every rank's queries may attend to this rank's keys) and keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:  # type: ignore[override]
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(size)]
        collectives.all_gather_list(parts, x, group, "sequence shards")
        ctx.group, ctx.dim, ctx.rank, ctx.length = group, dim, rank, x.shape[dim]
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        grad = collectives.sum_over(grad.contiguous().clone(), ctx.group, "gradient of the gathered sequence")
        return grad.narrow(ctx.dim, ctx.rank * ctx.length, ctx.length).contiguous(), None, None


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    """Differentiable all-gather of sequence shards along `dim`."""
    return _GatherSequence.apply(x, group, dim)


def gather_mask(mask: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """All-gather a [B, T_local] padding mask into [B, T] (no gradient)."""
    parts = [torch.empty_like(mask) for _ in range(dist.get_world_size(group))]
    collectives.all_gather_list(parts, mask.contiguous(), group, "padding mask")
    return torch.cat(parts, dim=1)


# ----------------------------------------------------------------------------------------------
# Modules


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 (bf16 statistics drift), result in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, head_dim] in fp32 for (global) integer positions [T]."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim
    inv_freq = 1.0 / theta**exponents
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().float(), emb.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; rotate-half convention, fp32 inside."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def _is_tail_padding(mask: torch.Tensor) -> bool:
    """True when every row's valid tokens form a prefix (mask is non-increasing along T)."""
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


class FullAttention(nn.Module):
    """Causal GQA with RoPE (q/k RMSNorm per head, sigmoid output gate as in Qwen3-Next),
    exact under context parallelism by all-gathering K/V over the CP group."""

    def __init__(self, cfg: ModelConfig, cp: CPConfig | None = None) -> None:
        super().__init__()
        self.cfg, self.cp = cfg, cp
        H, Hkv, D = cfg.num_attention_heads, cfg.num_kv_heads, cfg.attn_head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, H * D * (2 if cfg.attn_output_gate else 1), bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, Hkv * D, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, Hkv * D, bias=False)
        self.o_proj = nn.Linear(H * D, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(D, cfg.norm_eps)
        self.k_norm = RMSNorm(D, cfg.norm_eps)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, rope: tuple[torch.Tensor, torch.Tensor], offset: int
    ) -> torch.Tensor:
        B, T, _ = x.shape
        H, Hkv, D = self.cfg.num_attention_heads, self.cfg.num_kv_heads, self.cfg.attn_head_dim
        q = self.q_proj(x)
        gate = None
        if self.cfg.attn_output_gate:
            q, gate = q.view(B, T, H, 2 * D).chunk(2, dim=-1)
            gate = gate.reshape(B, T, H * D)
        q = self.q_norm(q.reshape(B, T, H, D)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, Hkv, D)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        full_mask = mask
        if cp_active(self.cp):
            group = self.cp.group  # type: ignore[union-attr]
            k, v = gather_sequence(k, group, 2), gather_sequence(v, group, 2)
            if mask is not None:
                full_mask = gather_mask(mask, group)
        # keys after this slice's last query are never attended: drop them before the kernel
        Tk = offset + T
        k, v = k[:, :, :Tk], v[:, :, :Tk]
        rep = H // Hkv
        if rep > 1:  # expand + reshape: its backward is a sum (repeat_interleave's is an index_add)
            k = k[:, :, None].expand(B, Hkv, rep, Tk, D).reshape(B, H, Tk, D)
            v = v[:, :, None].expand(B, Hkv, rep, Tk, D).reshape(B, H, Tk, D)
        if full_mask is None or _is_tail_padding(full_mask):
            # Tail padding: a valid query never sees a padded key through the causal mask, and
            # padded queries are zeroed below, so the plain causal kernel is exact.
            from torch.nn.attention.bias import causal_lower_right

            o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, Tk))
        else:
            qpos = torch.arange(offset, offset + T, device=x.device)
            kpos = torch.arange(Tk, device=x.device)
            causal = kpos[None, :] <= qpos[:, None]  # [T, Tk]
            key_ok = full_mask[:, :Tk].bool()[:, None, None, :] | (kpos[None, :] == qpos[:, None])
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & key_ok)
        o = o.transpose(1, 2).reshape(B, T, H * D)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        out = self.o_proj(o)
        if mask is not None:
            out = out * mask[..., None].to(out.dtype)  # padded positions give exact zeros
        return out


class DecoderLayer(nn.Module):
    """Pre-norm block: h + mixer(norm(h)), then h + SwiGLU(norm(h))."""

    def __init__(self, cfg: ModelConfig, index: int, backend: str, cp: CPConfig | None) -> None:
        super().__init__()
        self.layer_type = cfg.layer_type(index)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        if self.layer_type == "linear_attention":
            from gdn.layer import GatedDeltaNet

            self.linear_attn = GatedDeltaNet(cfg.layer_config(), backend=backend, cp=cp)
        else:
            self.self_attn = FullAttention(cfg, cp)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self,
        h: torch.Tensor,
        mask: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        offset: int,
    ) -> torch.Tensor:
        x = self.input_norm(h)
        if self.layer_type == "linear_attention":
            x = self.linear_attn(x, mask)
        else:
            x = self.self_attn(x, mask, (cos, sin), offset)
        h = h + x
        return h + self.mlp(self.post_norm(h))


class HybridModel(nn.Module):
    """Embedding -> decoder layers -> final RMSNorm -> lm_head. `forward` returns logits of this
    rank's slice; `loss` is this rank's share of the global mean cross-entropy."""

    def __init__(
        self, cfg: ModelConfig, *, backend: str = "eager", cp: CPConfig | None = None
    ) -> None:
        super().__init__()
        if backend not in ("eager", "triton"):
            raise ValueError(f"backend={backend!r} is not supported; expected 'eager' or 'triton'")
        self.cfg, self.backend, self.cp = cfg, backend, cp
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, backend, cp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._init_own_weights()

    def _init_own_weights(self) -> None:
        """Normal(0, init_std) for the embedding and this module's linears (the GDN layer keeps its
        own initialisation: A_log and dt_bias are not plain weights); residual outputs scaled
        by 1/sqrt(2·layers) so the stream does not grow with depth."""
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.num_layers)
        nn.init.normal_(self.embed_tokens.weight, std=self.cfg.embed_init_std)
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=std)
        elif self.cfg.embed_init_std != std:
            raise ValueError("tie_embeddings needs embed_init_std == init_std")
        for layer in self.layers:
            mods: list[nn.Linear] = [layer.mlp.gate_proj, layer.mlp.up_proj]
            if layer.layer_type == "full_attention":
                a = layer.self_attn
                mods += [a.q_proj, a.k_proj, a.v_proj]
                nn.init.normal_(a.o_proj.weight, std=out_std)
            for m in mods:
                nn.init.normal_(m.weight, std=std)
            nn.init.normal_(layer.mlp.down_proj.weight, std=out_std)

    def forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        position_offset: int | None = None,
    ) -> torch.Tensor:
        """input_ids, mask: [B, T_local] (mask 1 = valid). position_offset: global position of
        this slice's first token (default: contiguous CP sharding, rank * T_local)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T_local], got shape {tuple(input_ids.shape)}")
        if mask is not None and mask.shape != input_ids.shape:
            raise ValueError(
                f"mask must have input_ids' shape {tuple(input_ids.shape)}, got {tuple(mask.shape)}"
            )
        T = input_ids.shape[1]
        rank, _ = cp_rank_size(self.cp)
        offset = rank * T if position_offset is None else position_offset
        positions = torch.arange(offset, offset + T, device=input_ids.device)
        cos, sin = rope_tables(positions, self.cfg.attn_head_dim, self.cfg.rope_theta)
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, mask, cos, sin, offset)
        return self.lm_head(self.norm(h))

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor, num_valid: int) -> torch.Tensor:
        """Sum of this slice's cross-entropy over valid labels (fp32) divided by the global count."""
        if num_valid < 1:
            raise ValueError(f"num_valid must be >= 1 (the batch has no valid label), got {num_valid}")
        ce = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        return ce / num_valid


def set_gdn_chunk_size(model: nn.Module, chunk_size: int) -> None:
    """The GDN core's chunk length in every linear-attention layer. On the eager backend any
    length computes the same function in another summation order, which makes a candidate that
    differs from its reference only by rounding (the floor of a trajectory comparison); the Triton
    kernels take 64 only and say so when called."""
    from gdn.layer import GatedDeltaNet

    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    for module in model.modules():
        if isinstance(module, GatedDeltaNet):
            module.chunk_size = chunk_size


def build_model(
    cfg: ModelConfig | str,
    *,
    backend: str = "eager",
    cp: CPConfig | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> HybridModel:
    """Seeded construction on the CPU (so every rank and both sides of a trajectory start from
    the same weights whatever the device), then moved to `device`."""
    if isinstance(cfg, str):
        cfg = model_config(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device("cpu"):
            model = HybridModel(cfg, backend=backend, cp=cp)
    return model.to(device)
