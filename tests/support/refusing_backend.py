"""`module:function` backends for the runtime and CLI tests: `no_packed`, ours (eager) for every
input but packed sequences, which it refuses with NotImplementedError, as a backend without
varlen support does; `always_raises`, one that accepts everything and raises on every call;
`scaled_output`, ours with the output x 1.1."""

from __future__ import annotations

from typing import Any


def no_packed(q: Any, k: Any, v: Any, g: Any, beta: Any, *, cu_seqlens: Any = None, **kw: Any) -> Any:
    if cu_seqlens is not None:
        raise NotImplementedError("no_packed takes no cu_seqlens")
    from gdn.backends.eager import eager_core

    return eager_core(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)


def always_raises(q: Any, k: Any, v: Any, g: Any, beta: Any, **kw: Any) -> Any:
    """Declares no check (so accepts every shape) and raises on every call."""
    raise RuntimeError("illegal memory access in the fused kernel")


def scaled_output(q: Any, k: Any, v: Any, g: Any, beta: Any, **kw: Any) -> Any:
    """Ours (eager) with the output x 1.1: a wrong result, far outside every bound."""
    from gdn.backends.eager import eager_core

    o, state = eager_core(q, k, v, g, beta, **kw)
    return o * 1.1, state
