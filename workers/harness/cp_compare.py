"""One CP layer case against the no-CP reference, on every rank of a CP group.

Both sides are built from the same seed on every rank: the reference runs the full sequence, the
candidate this rank's shard. A packed case (`packed`: sequence lengths, B = 1) runs the candidate
on the packed batch (`cu_seqlens`) and the reference on each sequence alone, so the comparison
says that packing (and CP over it) changes nothing. Parameter gradients of the candidate are
summed over the group (what FSDP's reduce does) before they are compared with the reference's.
Used by the tests and by the `cp-layer` suite, so both check exactly the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import accumulate, pairwise
from typing import Any

import torch

from gdn import collectives
from gdn.cp.config import CPConfig, shard_sequence
from gdn.layer import GatedDeltaNet, GDNLayerConfig, gdn_layer_init_


@dataclass(frozen=True)
class LayerCase:
    """Inputs of one comparison. Row 0 of the batch is all valid; rows >= 1 hold `valid_len` tokens.
    `packed`: the lengths of the sequences packed into the batch (B = 1, they sum to seq_len)."""

    config: GDNLayerConfig
    mode: str
    backend: str = "eager"
    ref_backend: str = "eager"
    dtype: torch.dtype = torch.float64
    ref_dtype: torch.dtype | None = None  # None: the candidate's dtype
    batch: int = 1
    seq_len: int = 64
    valid_len: int | None = None
    seed: int = 0
    packed: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.packed is not None and (self.batch != 1 or sum(self.packed) != self.seq_len
                                        or self.valid_len is not None):
            raise ValueError(f"a packed case needs batch 1, no valid_len and lengths summing to seq_len="
                             f"{self.seq_len}; got batch {self.batch}, valid_len {self.valid_len}, "
                             f"packed {self.packed} (sum {sum(self.packed)})")

    def offsets(self) -> list[int] | None:
        """The packed sequences' offsets [0, ..., seq_len], or None."""
        return None if self.packed is None else [0, *accumulate(self.packed)]

    def cu_seqlens(self, device: torch.device) -> torch.Tensor | None:
        cu = self.offsets()
        return None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)


@dataclass
class LayerComparison:
    """(actual, expected) pairs on this rank: local output and input grad, full parameter grads."""

    output: tuple[torch.Tensor, torch.Tensor]
    input_grad: tuple[torch.Tensor, torch.Tensor]
    param_grads: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    grad_norm: tuple[float, float] = (0.0, 0.0)
    padding_max_abs: float = 0.0  # largest |output| at padded positions of this shard (must be 0)
    # The candidate against the no-CP layer on its own backend and dtype: CP's share of the error
    # alone. None when the reference is that layer already (same backend and dtype).
    plain: LayerComparison | None = None


def make_inputs(
    case: LayerCase, device: torch.device, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(x [B, T, hidden], mask [B, T] or None, dy [B, T, hidden]) from the case's seed, on `device`.

    Drawn in fp64 on the CPU and cast to `dtype` (default: the case's), so the reference and the
    candidate see the same values up to their own precision.
    """
    dtype = case.dtype if dtype is None else dtype
    gen = torch.Generator().manual_seed(case.seed + 1)
    B, T, Hd = case.batch, case.seq_len, case.config.hidden_size
    x = torch.randn(B, T, Hd, generator=gen, dtype=torch.float64)
    dy = torch.randn(B, T, Hd, generator=gen, dtype=torch.float64) / (B * T) ** 0.5
    mask = None
    if case.valid_len is not None:
        if not 0 < case.valid_len <= T:
            raise ValueError(f"valid_len must be in [1, seq_len={T}], got {case.valid_len}")
        mask = torch.ones(B, T, dtype=dtype)
        mask[1:, case.valid_len :] = 0
        mask = mask.to(device)
    return x.to(device, dtype), mask, dy.to(device, dtype)


def build_layer(
    case: LayerCase, cp: CPConfig | None, backend: str, device: torch.device, dtype: torch.dtype | None = None
) -> GatedDeltaNet:
    """The layer with weights drawn from the case's seed (identical on every rank), in `dtype`."""
    layer = GatedDeltaNet(case.config, backend=backend, cp=cp)
    return gdn_layer_init_(layer, case.seed).to(device=device, dtype=case.dtype if dtype is None else dtype)


def reference_layer_step(
    case: LayerCase, device: torch.device
) -> tuple[GatedDeltaNet, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The no-CP layer on the full sequence (a packed case: on each sequence alone, the outputs
    joined, the gradients summed): (layer with grads, output, input grad, mask)."""
    ref_dtype = case.ref_dtype or case.dtype
    x, mask, dy = make_inputs(case, device, ref_dtype)
    ref = build_layer(case, None, case.ref_backend, device, ref_dtype)
    x = x.clone().requires_grad_(True)
    cu = case.offsets()
    if cu is None:
        y = ref(x, mask)
        y.backward(dy)
        return ref, y.detach(), x.grad, mask  # type: ignore[return-value]
    outs = []
    for a, b in pairwise(cu):
        y = ref(x[:, a:b])
        y.backward(dy[:, a:b])
        outs.append(y.detach())
    return ref, torch.cat(outs, dim=1), x.grad, mask  # type: ignore[return-value]


def cp_layer_step(
    case: LayerCase, cp: CPConfig, device: torch.device
) -> tuple[GatedDeltaNet, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The CP layer on this rank's shard.

    Returns (layer with group-summed grads, local output, local input grad, local mask).
    """
    x, mask, dy = make_inputs(case, device)
    layer = build_layer(case, cp, case.backend, device)
    x_loc = shard_sequence(x, cp, 1).clone().requires_grad_(True)
    m_loc = None if mask is None else shard_sequence(mask, cp, 1)
    y = layer(x_loc, m_loc, case.cu_seqlens(device))
    y.backward(shard_sequence(dy, cp, 1))
    sum_param_grads(layer, cp)
    return layer, y.detach(), x_loc.grad, m_loc  # type: ignore[return-value]


def sum_param_grads(layer: torch.nn.Module, cp: CPConfig) -> None:
    """Sum every parameter's gradient over the CP group (each rank holds its shard's contribution)."""
    if not cp.enabled:
        return
    for name, p in layer.named_parameters():
        if p.grad is not None:
            p.grad = collectives.sum_over(p.grad, cp.group, f"gradient of {name}")


def grad_norm(layer: torch.nn.Module) -> float:
    return float(
        torch.sqrt(sum(p.grad.double().pow(2).sum() for p in layer.parameters() if p.grad is not None))
    )


def _pair(
    cand: torch.nn.Module, y: torch.Tensor, dx: torch.Tensor, ref: torch.nn.Module, y_ref: torch.Tensor,
    dx_ref: torch.Tensor, cp: CPConfig | None,
) -> LayerComparison:
    """Candidate tensors (this rank's shard) against the reference's (the full sequence)."""
    ref_params = dict(ref.named_parameters())
    return LayerComparison(
        output=(y, shard_sequence(y_ref, cp, 1)),
        input_grad=(dx, shard_sequence(dx_ref, cp, 1)),
        param_grads={n: (p.grad, ref_params[n].grad) for n, p in cand.named_parameters()},  # type: ignore[misc]
        grad_norm=(grad_norm(cand), grad_norm(ref)),
    )


def _padding_max_abs(y: torch.Tensor, mask: torch.Tensor | None) -> float:
    if mask is None:
        return 0.0
    pad = (mask == 0).unsqueeze(-1).expand_as(y)
    return float(y.detach()[pad].abs().max()) if pad.any() else 0.0


def _add_plain(
    out: LayerComparison, case: LayerCase, cand: torch.nn.Module, cp: CPConfig | None, device: torch.device
) -> None:
    """When the reference differs from the candidate's own no-CP layer (backend or dtype), pair the
    candidate with that layer too: the two cores' rounding then drops out of the comparison."""
    if case.ref_backend == case.backend and (case.ref_dtype or case.dtype) == case.dtype:
        return
    own = replace(case, ref_backend=case.backend, ref_dtype=None)
    plain, y_p, dx_p, _ = reference_layer_step(own, device)
    out.plain = _pair(cand, out.output[0], out.input_grad[0], plain, y_p, dx_p, cp)


def compare_layer(case: LayerCase, cp: CPConfig, device: torch.device) -> LayerComparison:
    """Run the reference and the candidate on this rank and pair their tensors."""
    ref, y_ref, dx_ref, _ = reference_layer_step(case, device)
    cand, y, dx, m_loc = cp_layer_step(case, cp, device)
    out = _pair(cand, y, dx, ref, y_ref, dx_ref, cp)
    del ref, y_ref, dx_ref
    out.padding_max_abs = _padding_max_abs(y, m_loc)
    _add_plain(out, case, cand, cp, device)
    return out


def compare_emulated(case: LayerCase, num_shards: int, device: torch.device) -> LayerComparison:
    """The single-process P2P emulation (`num_shards` shards, the case's backend) vs the no-CP layer."""
    from gdn.cp.emulation import emulated_p2p_layer

    return _compare_in_process(case, device, lambda layer, x, mask, cu: emulated_p2p_layer(
        layer, x, mask, num_shards=num_shards, cu_seqlens=cu))


def compare_no_cp(case: LayerCase, device: torch.device) -> LayerComparison:
    """The no-CP layer (the case's backend and dtype) on the whole batch vs the reference: for a
    packed case, the packed layer against each sequence alone."""
    return _compare_in_process(case, device, lambda layer, x, mask, cu: layer(x, mask, cu))


def _compare_in_process(case: LayerCase, device: torch.device, forward: Any) -> LayerComparison:
    """`forward(layer, x, mask, cu_seqlens)` on the full batch in this process vs the reference."""
    ref, y_ref, dx_ref, _ = reference_layer_step(case, device)
    x, mask, dy = make_inputs(case, device)
    cand = build_layer(case, None, case.backend, device)
    x = x.clone().requires_grad_(True)
    y = forward(cand, x, mask, case.cu_seqlens(device))
    y.backward(dy)
    out = _pair(cand, y.detach(), x.grad, ref, y_ref, dx_ref, None)  # type: ignore[arg-type]
    del ref, y_ref, dx_ref
    out.padding_max_abs = _padding_max_abs(y, mask)
    _add_plain(out, case, cand, None, device)
    return out
