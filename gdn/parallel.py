"""Distributed wrapping of the hybrid model: CP group and device mesh, FSDP2 over the CP group,
per-layer activation checkpointing, deterministic mode, gradient norm and gradient sync.

Report layout (docs/cp.md, Contract): the FSDP sharding group *is* the CP group, each rank holds
one sequence shard of the same sample and one parameter shard. Each rank's loss is its share of
the global mean (see `gdn.model.HybridModel.loss`), so the parameter gradient is the *sum* over
ranks: FSDP's reduce-scatter is told to divide by 1, not by the group size (averaging would be
data-parallel semantics and give 1/P of the true gradient).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from gdn import collectives

CHECKPOINT_MODES: tuple[str, ...] = ("off", "full")


def resolve_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """The process group itself (None means the default group); requires torch.distributed."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised; call init_process_group first")
    return group if group is not None else dist.group.WORLD  # type: ignore[return-value]


def cp_device_mesh(group: dist.ProcessGroup | None, device_kind: str):  # -> DeviceMesh
    """A 1-D DeviceMesh over the CP group, used as FSDP's sharding mesh."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(resolve_group(group), device_type=device_kind, mesh_dim_names=("cp",))


def make_cp(mode: str, group: dist.ProcessGroup | None = None):  # -> gdn.cp.CPConfig
    """CPConfig for `mode` over `group` ("none" needs no process group)."""
    from gdn.cp import CPConfig

    return CPConfig(mode=mode, group=group)  # type: ignore[arg-type]


def apply_activation_checkpoint(model: nn.Module, mode: str) -> nn.Module:
    """Wrap every decoder layer in a non-reentrant activation checkpoint when mode == "full".

    Applied before FSDP so the FSDP unit is the wrapper and the recompute runs inside the
    unsharded parameters (the torchtitan order)."""
    if mode not in CHECKPOINT_MODES:
        raise ValueError(
            f"activation checkpoint mode {mode!r} is not supported; expected one of {CHECKPOINT_MODES}"
        )
    if mode == "off":
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    layers = model.layers  # type: ignore[attr-defined]
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(
            layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False
        )
    return model


def apply_fsdp(model: nn.Module, mesh, *, reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2 `fully_shard` per decoder layer and at the root over `mesh` (the CP group); gradients
    are summed over the group, not averaged (see the module docstring)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    check_fsdp_api(FSDPModule)
    # FSDP's reduce-scatters do not pass through gdn.collectives: check their dtype here
    collectives.check_fsdp_dtypes(list(model.parameters()), mesh.get_group(), "FSDP gradients")
    for layer in model.layers:  # type: ignore[attr-defined]
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            # plain SUM collectives: gloo has no PREMUL_SUM, and a divide by 1 needs none
            m.set_force_sum_reduction_for_comms(True)
    return model


FSDP_SUM_API: tuple[str, ...] = ("set_gradient_divide_factor", "set_force_sum_reduction_for_comms")


def check_fsdp_api(fsdp_module: type) -> None:
    """Refuse, before any sharding, a torch whose FSDP2 lacks the sum-reduction API (torch < 2.9
    may; docs/npu.md pins one that has it): without it FSDP averages (1/P of the true gradient)
    or uses PREMUL_SUM/AVG, which HCCL and gloo do not have."""
    missing = [name for name in FSDP_SUM_API if not hasattr(fsdp_module, name)]
    if missing:
        raise RuntimeError(
            f"torch {torch.__version__} has no FSDP2 {', '.join(missing)}; fsdp=True needs a torch that "
            "has them (docs/npu.md lists a tested set); run with fsdp=False on this torch"
        )


def is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def sync_replicated_grads(model: nn.Module, group: dist.ProcessGroup | None) -> None:
    """CP without FSDP: every rank holds the full parameters and a partial gradient; sum them."""
    for name, p in model.named_parameters():
        if p.grad is not None:
            p.grad = collectives.sum_over(p.grad, resolve_group(group), f"gradient of {name}")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def global_grad_norm(
    model: nn.Module, group: dist.ProcessGroup | None = None, *, sharded: bool | None = None
) -> float:
    """L2 norm of the whole gradient in fp64. With FSDP each rank holds a disjoint shard of every
    gradient, so the squares are summed over `group`; replicated gradients are counted once."""
    sharded = is_fsdp(model) if sharded is None else sharded
    total = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        if p.grad is not None:
            total += _local(p.grad).detach().double().pow(2).sum().cpu()
    if sharded and dist.is_initialized():
        t = total.to(_local(next(model.parameters())).device)  # where this rank's collectives run
        total = collectives.sum_over(t, resolve_group(group), "squared gradient norm").cpu()
    return float(total.sqrt())


def named_full_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor on CPU) of every parameter: FSDP shards are gathered (a collective: call
    on every rank), checkpoint-wrapper prefixes removed so wrapped and plain models line up."""
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        yield name.replace("_checkpoint_wrapped_module.", ""), full.detach().cpu()
