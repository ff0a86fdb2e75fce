"""The built-in backends: `eager` (ours, torch), `triton` (ours, `kernels`), `fla` (pure
flash-linear-attention) and `flashqla` (FlashQLA's TileLang kernels). The last two are optional
installs (`gdnval[fla]`, `gdnval[flashqla]`): their check names the missing package, and nothing is
imported before a call needs it.

`fla` is FLA's own kernels and nothing else: FLA 0.6 silently dispatches its
`chunk_gated_delta_rule` to FlashQLA when `flash_qla` is importable, unless its switch
`FLA_FLASH_QLA=0` is set. FLA reads the switch at every call (`fla.backends`' `is_enabled`, not
cached by its dispatch), so one process can run both `fla` and `flashqla`. This backend sets the
switch (when unset) before its first call, and refuses to run when it is set to anything else, so
a result labelled `fla` never comes from FlashQLA.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import torch

from gdn.backends.base import Backend
from gdn.backends.eager import eager_core
from gdn.capability import GDNShape, UnsupportedGDNRequest, check_triton_gdn, triton_interpreter_on

FLA_FLASH_QLA_ENV = "FLA_FLASH_QLA"
PEER_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _eager_check(shape: GDNShape, dtype: torch.dtype, device: torch.device) -> str | None:
    return None  # torch runs every valid request (gdn.ops checks the inputs) on every device


def _triton_check(shape: GDNShape, dtype: torch.dtype, device: torch.device) -> str | None:
    try:
        check_triton_gdn(shape, device=device, dtype=dtype)
    except UnsupportedGDNRequest as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=256)
def _triton_reason(
    shape: GDNShape, device: torch.device, dtype: torch.dtype, chunk_size: int, interpreter: bool
) -> str | None:
    """`check_triton_gdn`'s refusal, once per request signature (`interpreter`: the Triton
    interpreter's switch, which the CPU check reads, is part of the signature)."""
    try:
        check_triton_gdn(shape, device=device, dtype=dtype, chunk_size=chunk_size)
    except UnsupportedGDNRequest as exc:
        return str(exc)
    return None


def _triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
    scale: float | None, initial_state: torch.Tensor | None, output_final_state: bool,
    cu_seqlens: torch.Tensor | None, chunk_size: int = 64, on_final_state: Any = None,
    on_initial_state_grad: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    reason = _triton_reason(GDNShape.of(q, v), q.device, v.dtype, chunk_size, triton_interpreter_on())
    if reason is not None:
        raise UnsupportedGDNRequest(reason)
    if cu_seqlens is not None:
        if on_final_state is not None or on_initial_state_grad is not None:
            raise UnsupportedGDNRequest(
                "on_final_state / on_initial_state_grad are not supported with cu_seqlens on backend "
                "'triton': drop them, or run the sequences unpacked"
            )
        from kernels.gdn import gated_delta_rule_triton_varlen

        return gated_delta_rule_triton_varlen(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state,
        )
    from kernels.gdn import gated_delta_rule_triton

    return gated_delta_rule_triton(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        on_final_state=on_final_state, on_initial_state_grad=on_initial_state_grad,
    )


def _peer_check(name: str, module: str, extra: str, shape: GDNShape, dtype: torch.dtype,
                device: torch.device) -> str | None:
    if importlib.util.find_spec(module) is None:
        return (f"backend {name!r} is not installed: the module {module!r} is not importable "
                f"(pip install 'gdnval[{extra}]')")
    if device.type != "cuda":
        return f"backend {name!r} needs CUDA tensors, got {device.type!r} tensors"
    if dtype not in PEER_DTYPES:
        return f"backend {name!r} does not take {dtype}; expected one of {', '.join(map(str, PEER_DTYPES))}"
    return None


def pure_fla_reason() -> str | None:
    """Why FLA might dispatch to FlashQLA in this process, or None once the switch is off."""
    os.environ.setdefault(FLA_FLASH_QLA_ENV, "0")
    value = os.environ[FLA_FLASH_QLA_ENV]
    if value != "0":
        return (f"backend 'fla' is pure FLA, but {FLA_FLASH_QLA_ENV}={value!r} lets FLA dispatch to "
                f"FlashQLA; set {FLA_FLASH_QLA_ENV}=0 (or unset it), or name backend 'flashqla'")
    return None


def _fla_check(shape: GDNShape, dtype: torch.dtype, device: torch.device) -> str | None:
    return _peer_check("fla", "fla", "fla", shape, dtype, device) or pure_fla_reason()


@functools.cache
def _fla_fn() -> Any:
    """FLA's `chunk_gated_delta_rule`, imported once (an import statement per call is host time)."""
    import fla.ops.common.chunk_o as fla_chunk_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    # FLA 0.6.0 refuses its gated backward on Hopper with Triton < 3.7.1 (its issue 640); we set
    # its own flag to time it and record its accuracy beside ours.
    fla_chunk_o.TRITON_ABOVE_3_7_1 = True
    return chunk_gated_delta_rule


def _fla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
    scale: float | None, initial_state: torch.Tensor | None, output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    reason = pure_fla_reason()  # before the first `import fla` of the process, and every call
    if reason is not None:
        raise UnsupportedGDNRequest(reason)
    return _fla_fn()(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )


def _flashqla_check(shape: GDNShape, dtype: torch.dtype, device: torch.device) -> str | None:
    return _peer_check("flashqla", "flash_qla", "flashqla", shape, dtype, device)


@functools.cache
def _flashqla_fn() -> Any:
    """FlashQLA's `chunk_gated_delta_rule`, imported once."""
    from flash_qla import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def _flashqla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
    scale: float | None, initial_state: torch.Tensor | None, output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    return _flashqla_fn()(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )


BUILTINS: dict[str, Backend] = {
    "eager": Backend("eager", eager_core, _eager_check, module="gdn", options=frozenset({"chunk_size"}),
                     description="ours: chunked torch with autograd, any device and dtype"),
    "triton": Backend("triton", _triton, _triton_check, module="kernels",
                      options=frozenset({"chunk_size", "on_final_state", "on_initial_state_grad"}),
                      description="ours: the Triton kernels (head dim 128, chunk 64)"),
    "fla": Backend("fla", _fla, _fla_check, module="fla",
                   description=f"flash-linear-attention's chunk_gated_delta_rule, {FLA_FLASH_QLA_ENV}=0"),
    "flashqla": Backend("flashqla", _flashqla, _flashqla_check, module="flash_qla",
                        description="FlashQLA's chunk_gated_delta_rule (TileLang)"),
}
