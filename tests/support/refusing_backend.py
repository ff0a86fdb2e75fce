"""A `module:function` backend for the runtime tests: ours (eager) for every input but packed
sequences, which it refuses with NotImplementedError, as a backend without varlen support does."""

from __future__ import annotations

from typing import Any


def no_packed(q: Any, k: Any, v: Any, g: Any, beta: Any, *, cu_seqlens: Any = None, **kw: Any) -> Any:
    if cu_seqlens is not None:
        raise NotImplementedError("no_packed takes no cu_seqlens")
    from gdn.backends.eager import eager_core

    return eager_core(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)
