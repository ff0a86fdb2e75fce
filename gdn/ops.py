"""Backend dispatch for the gated delta rule, the Triton capability check, and fail-fast errors.

No request falls back silently: an unsupported backend, shape, dtype or device raises at once
with the value and what is supported. The Triton backend is imported on first use only, so
`import gdn` on a CPU machine never loads Triton or `kernels`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from gdn.reference import chunk_gated_delta_rule_eager

Backend = Literal["eager", "triton"]
BACKENDS: tuple[str, ...] = ("eager", "triton")
TRITON_HEAD_DIM = 128
TRITON_CHUNK_SIZE = 64
TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
EAGER_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


class UnsupportedGDNRequest(ValueError):
    """A request the chosen backend does not support; raised instead of any fall-back."""


@dataclass(frozen=True)
class GDNShape:
    """Problem size of one call: batch, tokens, q/k heads, value heads, key and value head dims."""

    batch: int
    seq_len: int
    num_qk_heads: int
    num_v_heads: int
    head_dim_k: int = 128
    head_dim_v: int = 128

    @classmethod
    def of(cls, q: torch.Tensor, v: torch.Tensor) -> GDNShape:
        return cls(q.shape[0], q.shape[1], q.shape[2], v.shape[2], q.shape[3], v.shape[3])


def triton_interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_triton_gdn(
    shape: GDNShape | tuple[int, ...],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    chunk_size: int = TRITON_CHUNK_SIZE,
) -> None:
    """Raise `UnsupportedGDNRequest` naming the reason when the Triton backend cannot run `shape`.

    `device` defaults to the current CUDA device when there is one, else the CPU.
    """
    if not isinstance(shape, GDNShape):
        shape = GDNShape(*shape)
    if chunk_size != TRITON_CHUNK_SIZE:
        raise UnsupportedGDNRequest(
            f"chunk_size={chunk_size} is not supported by the Triton backend; it supports only "
            f"chunk_size={TRITON_CHUNK_SIZE}"
        )
    if shape.head_dim_k != TRITON_HEAD_DIM or shape.head_dim_v != TRITON_HEAD_DIM:
        raise UnsupportedGDNRequest(
            f"head_dim (k={shape.head_dim_k}, v={shape.head_dim_v}) is not supported by the Triton "
            f"backend; it supports only head_dim={TRITON_HEAD_DIM}"
        )
    if min(shape.batch, shape.seq_len, shape.num_qk_heads, shape.num_v_heads) < 1:
        raise UnsupportedGDNRequest(f"empty problem {shape}: batch, seq_len and heads must be >= 1")
    if shape.num_v_heads % shape.num_qk_heads:
        raise UnsupportedGDNRequest(
            f"num_v_heads={shape.num_v_heads} is not a multiple of num_qk_heads={shape.num_qk_heads}"
        )
    if dtype not in TRITON_DTYPES:
        raise UnsupportedGDNRequest(
            f"dtype {dtype} is not supported by the Triton backend; expected one of "
            f"{', '.join(str(d) for d in TRITON_DTYPES)}"
        )
    if device is None:
        from gdn import device as devices

        device = "cuda" if devices.is_available("cuda") else "cpu"
    device = torch.device(device)
    # The device first: on an NPU the real reason is the device, whether Triton is installed or not.
    if device.type not in ("cpu", "cuda"):
        raise UnsupportedGDNRequest(
            f"the Triton backend needs CUDA (or CPU under TRITON_INTERPRET=1), not {device.type!r} "
            f"tensors; on {device.type} use backend='eager', or a registered Ascend backend"
        )
    if importlib.util.find_spec("triton") is None:
        raise UnsupportedGDNRequest(
            "backend='triton' requested but Triton is not installed (pip install 'gdnval[triton]'); "
            "use backend='eager'"
        )
    if device.type == "cpu" and not triton_interpreter_on():
        raise UnsupportedGDNRequest(
            "backend='triton' on CPU tensors needs the Triton interpreter (TRITON_INTERPRET=1); "
            "move the tensors to a CUDA device or use backend='eager'"
        )


def is_triton_gdn_available(
    shape: GDNShape | tuple[int, ...],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    chunk_size: int = TRITON_CHUNK_SIZE,
) -> bool:
    """True when `check_triton_gdn` passes and the kernel module imports on this machine."""
    try:
        check_triton_gdn(shape, device=device, dtype=dtype, chunk_size=chunk_size)
        importlib.import_module("kernels.gdn")
    except (UnsupportedGDNRequest, ImportError, RuntimeError):
        return False
    return True


def _validate_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> None:
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    if initial_state is not None:
        named["initial_state"] = initial_state
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name in ("q", "k", "v"):
        if named[name].dim() != 4:
            raise ValueError(f"{name} must be [B, T, H, D], got shape {tuple(named[name].shape)}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    B, T, Hqk, Dk = q.shape
    if v.shape[:2] != (B, T):
        raise ValueError(f"v must be [B={B}, T={T}, Hv, Dv], got shape {tuple(v.shape)}")
    Hv, Dv = v.shape[2], v.shape[3]
    if Hv % Hqk:
        raise ValueError(f"v heads Hv={Hv} must be a multiple of q/k heads Hqk={Hqk}")
    for name in ("g", "beta"):
        if tuple(named[name].shape) != (B, T, Hv):
            raise ValueError(f"{name} must be [B, T, Hv]=[{B}, {T}, {Hv}], got {tuple(named[name].shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (B, Hv, Dk, Dv):
        raise ValueError(
            f"initial_state must be [B, Hv, Dk, Dv]=[{B}, {Hv}, {Dk}, {Dv}], got {tuple(initial_state.shape)}"
        )
    devices = {t.device for t in named.values()}
    if len(devices) > 1:
        where = ", ".join(f"{n}={t.device}" for n, t in named.items())
        raise ValueError(f"all tensors must be on one device, got {where}")
    for name, t in named.items():
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if v.dtype not in EAGER_DTYPES:
        raise TypeError(f"dtype {v.dtype} is not supported; expected one of {EAGER_DTYPES}")


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: Backend = "eager",
    chunk_size: int = 64,
    on_final_state: Callable[[torch.Tensor], None] | None = None,
    on_initial_state_grad: Callable[[torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule over [B, T, H, D] inputs; returns (o, final_state or None).

    q, k: [B, T, Hqk, Dk]; v: [B, T, Hv, Dv] with Hv % Hqk == 0; g (log-space decay, <= 0) and
    beta: [B, T, Hv]; initial_state: [B, Hv, Dk, Dv] fp32. `o` has v's dtype; the final state is
    fp32 (fp64 for fp64 inputs on the eager backend).

    Triton only: `on_final_state(S_end)` runs once the forward's state pass is done, before the
    output stage; `on_initial_state_grad(dS_0)` once the backward's reverse state pass is done,
    before the input-gradient stages. The P2P chain sends these on early (gdn/cp/p2p.py).
    """
    if backend not in BACKENDS:
        raise UnsupportedGDNRequest(
            f"backend={backend!r} is not supported; choose one of {', '.join(map(repr, BACKENDS))} "
            "explicitly (there is no automatic fall-back)"
        )
    _validate_inputs(q, k, v, g, beta, initial_state)
    if chunk_size < 1:
        raise UnsupportedGDNRequest(f"chunk_size must be >= 1, got {chunk_size}")
    if backend == "eager":
        if on_final_state is not None or on_initial_state_grad is not None:
            raise UnsupportedGDNRequest(
                "on_final_state / on_initial_state_grad need backend='triton' (the eager backend "
                "has no stage boundary to call them at)"
            )
        return chunk_gated_delta_rule_eager(
            q, k, v, g, beta,
            scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, chunk_size=chunk_size,
        )  # fmt: skip
    check_triton_gdn(GDNShape.of(q, v), device=q.device, dtype=v.dtype, chunk_size=chunk_size)
    from kernels.gdn import gated_delta_rule_triton

    return gated_delta_rule_triton(
        q, k, v, g, beta,
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        on_final_state=on_final_state, on_initial_state_grad=on_initial_state_grad,
    )  # fmt: skip
