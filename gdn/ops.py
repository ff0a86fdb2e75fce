"""`gated_delta_rule`: input checks and dispatch by backend name, with fail-fast errors.

No request falls back silently: an unknown backend, or a shape, dtype or device the named backend
does not support, raises at once with the value and what is supported. Backends are looked up in
`gdn.backends` (built-ins, the `gdnval.backends` entry points, `module:function`); the Triton one
imports `kernels` on first use only, so `import gdn` on a CPU machine never loads Triton. The
problem size, the refusal and the Triton capability check live in `gdn.capability`, which the
backends build on: the dispatch imports the backends, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gdn.backends import get_backend
from gdn.capability import (
    TRITON_CHUNK_SIZE,
    GDNShape,
    UnsupportedGDNRequest,
    check_triton_gdn,
    is_triton_gdn_available,
    triton_interpreter_on,
)
from gdn.packing import check_cu_seqlens

# the capability names are this module's public API too (gdn.capability holds them so that the
# backends can build on them without importing the dispatch)
__all__ = [
    "GDNShape",
    "UnsupportedGDNRequest",
    "check_triton_gdn",
    "gated_delta_rule",
    "is_triton_gdn_available",
    "triton_interpreter_on",
]

EAGER_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _validate_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None = None,
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
    if cu_seqlens is not None:
        n = len(check_cu_seqlens(cu_seqlens, batch=B, seq_len=T)) - 1
        if initial_state is not None and tuple(initial_state.shape) != (n, Hv, Dk, Dv):
            raise ValueError(
                f"initial_state must be [N, Hv, Dk, Dv]=[{n}, {Hv}, {Dk}, {Dv}], one state per packed "
                f"sequence (N=len(cu_seqlens)-1={n}), got {tuple(initial_state.shape)}"
            )
    elif initial_state is not None and tuple(initial_state.shape) != (B, Hv, Dk, Dv):
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


# Signatures of requests that passed every check of `_check_request`, each with its backend.
# Those checks depend on nothing but the backend, the options and each tensor's type, shape,
# dtype and device (a capability check is a function of shape, dtype and device), so a repeated
# call with the same signature skips them: a dictionary look-up instead of tens of microseconds
# of host time, which a backend that launches about as fast as its kernels run adds to its time.
# The signature holds the backend's id; the entry holds the backend, so that id is not reused.
_PASSED: dict[tuple[object, ...], object] = {}
_PASSED_MAX = 1024


def _signature(
    impl: object, chunk_size: int, extra: dict[str, object], tensors: tuple[object, ...]
) -> tuple[object, ...] | None:
    """What the checks read from one request, or None when an argument is not a tensor (the
    full checks then name it)."""
    sig: list[object] = [id(impl), chunk_size, *sorted(extra)] if extra else [id(impl), chunk_size]
    for t in tensors:
        if t is None:
            sig.append(None)
        elif isinstance(t, torch.Tensor):
            sig += (t.shape, t.dtype, t.device)
        else:
            return None
    return tuple(sig)


def _check_request(
    impl: Any,
    backend: object,
    chunk_size: int,
    extra: dict[str, object],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
) -> None:
    """Every fail-fast check of `gated_delta_rule`: the inputs, the options the backend takes,
    and the backend's capability for this shape, dtype and device."""
    _validate_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    if chunk_size < 1:
        raise UnsupportedGDNRequest(f"chunk_size must be >= 1, got {chunk_size}")
    refused = sorted(set(extra) - impl.options)
    if any(n.startswith("on_") for n in refused):
        raise UnsupportedGDNRequest(
            f"on_final_state / on_initial_state_grad need backend='triton' (backend {backend!r} has "
            "no stage boundary to call them at)"
        )
    if refused:
        raise UnsupportedGDNRequest(
            f"chunk_size={chunk_size} is not supported by backend {backend!r}, which runs its own "
            f"chunking; leave chunk_size at {TRITON_CHUNK_SIZE} or use backend='eager'"
        )
    reason = impl.unsupported(GDNShape.of(q, v, cu_seqlens), v.dtype, q.device)
    if reason is not None:
        raise UnsupportedGDNRequest(reason)


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
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "eager",
    chunk_size: int = 64,
    on_final_state: Callable[[torch.Tensor], None] | None = None,
    on_initial_state_grad: Callable[[torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule over [B, T, H, D] inputs; returns (o, final_state or None).

    q, k: [B, T, Hqk, Dk]; v: [B, T, Hv, Dv] with Hv % Hqk == 0; g (log-space decay, <= 0) and
    beta: [B, T, Hv]; initial_state: [B, Hv, Dk, Dv] fp32. `o` has v's dtype; the final state is
    fp32 (fp64 for fp64 inputs on the eager backend). With `cu_seqlens` (N+1 int offsets), B = 1
    holds N packed sequences and the states are [N, Hv, Dk, Dv] (gdn.packing).

    `backend` is any name `gdn.backends.get_backend` resolves. `chunk_size` other than 64 and the
    two hooks go only to backends that declare them (eager: chunk_size; triton: the hooks):
    `on_final_state(S_end)` runs once the forward's state pass is done, before the output stage;
    `on_initial_state_grad(dS_0)` once the backward's reverse state pass is done, before the
    input-gradient stages. The P2P chain sends these on early (gdn/cp/p2p.py).
    """
    impl = get_backend(backend)
    extra: dict[str, object] = {"chunk_size": chunk_size} if chunk_size != TRITON_CHUNK_SIZE else {}
    if on_final_state is not None:
        extra["on_final_state"] = on_final_state
    if on_initial_state_grad is not None:
        extra["on_initial_state_grad"] = on_initial_state_grad
    key = _signature(impl, chunk_size, extra, (q, k, v, g, beta, initial_state, cu_seqlens))
    if key is not None and _PASSED.get(key) is impl:
        if cu_seqlens is not None:  # its values can change between calls of one signature
            check_cu_seqlens(cu_seqlens, batch=q.shape[0], seq_len=q.shape[1])
    else:
        _check_request(impl, backend, chunk_size, extra, q, k, v, g, beta, initial_state, cu_seqlens)
        if key is not None:
            if len(_PASSED) >= _PASSED_MAX:
                _PASSED.clear()
            _PASSED[key] = impl
    return impl.fn(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, **extra,
    )
