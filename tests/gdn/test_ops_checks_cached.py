"""`gated_delta_rule` runs its checks once per request signature, and every fail-fast error
still fires: a new shape, dtype or device is checked again, packed offsets on every call."""

from __future__ import annotations

import pytest
import torch

from gdn import GDNShape, UnsupportedGDNRequest, gated_delta_rule
from gdn.backends import Backend
from gdn.backends.eager import eager_core
from tests.support.gdn_inputs import make_inputs


def _counting_backend(refuse_above: int) -> tuple[Backend, list[int]]:
    """The eager core behind a capability check that counts its calls and refuses T > refuse_above."""
    seen: list[int] = []

    def check(shape: GDNShape, dtype: torch.dtype, device: torch.device) -> str | None:
        seen.append(shape.seq_len)
        return f"T={shape.seq_len} > {refuse_above}" if shape.seq_len > refuse_above else None

    return Backend("counting", eager_core, check), seen


def _run(backend: Backend, T: int, **kw: object) -> torch.Tensor:
    x = make_inputs(1, T, 1, 2, 4, **kw)  # type: ignore[arg-type]
    o, _ = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, backend=backend)
    return o


def test_capability_check_runs_once_per_signature_and_still_refuses() -> None:
    backend, seen = _counting_backend(refuse_above=16)
    for _ in range(3):
        _run(backend, 8)
    assert seen == [8]  # one check for three calls of one signature
    _run(backend, 8, dtype=torch.float32)
    assert seen == [8, 8]  # another dtype is another signature
    for _ in range(2):  # a refused request is never remembered: it raises every time
        with pytest.raises(UnsupportedGDNRequest, match=r"T=32 > 16"):
            _run(backend, 32)
    assert seen == [8, 8, 32, 32]


def test_input_errors_fire_after_a_cached_success() -> None:
    backend, _ = _counting_backend(refuse_above=1 << 20)
    x = make_inputs(1, 8, 1, 2, 4)
    gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, backend=backend)
    with pytest.raises(ValueError, match=r"g must be \[B, T, Hv\]=\[1, 8, 2\]"):
        gated_delta_rule(x.q, x.k, x.v, x.g[:, :, :1], x.beta, initial_state=x.h0, backend=backend)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        gated_delta_rule(x.q, x.k, x.v.float(), x.g, x.beta, initial_state=x.h0, backend=backend)
    with pytest.raises(TypeError, match=r"beta must be a torch\.Tensor"):
        gated_delta_rule(x.q, x.k, x.v, x.g, 0.5, initial_state=x.h0, backend=backend)  # type: ignore[arg-type]


def test_packed_offsets_are_checked_on_every_call() -> None:
    """Offsets of one shape can hold other values: they are checked every call, cached or not."""
    x = make_inputs(1, 8, 1, 2, 4, stateful=False)
    good = torch.tensor([0, 3, 8], dtype=torch.int32)
    o, _ = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=good, backend="eager")
    assert o.shape == x.v.shape
    bad = torch.tensor([1, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"must start at 0, got 1"):
        gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=bad, backend="eager")
    good[2] = 7  # the same tensor, changed in place
    with pytest.raises(ValueError, match=r"must end at T=8, got 7"):
        gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=good, backend="eager")
