"""What a core backend is: the call protocol and the capability check.

A backend is any callable `(q, k, v, g, beta, *, scale, initial_state, output_final_state,
cu_seqlens) -> (o, final_state | None)` whose outputs carry autograd to every input, the initial
state included. Its capability check says, for a problem size, dtype and device, whether it runs
them, and if not, why: callers raise that reason instead of falling back to another backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from gdn.capability import GDNShape


class CoreFn(Protocol):
    """The call every backend implements (FLA's `chunk_gated_delta_rule` keywords)."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        *,
        scale: float | None,
        initial_state: torch.Tensor | None,
        output_final_state: bool,
        cu_seqlens: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


# (shape, dtype, device) -> None when supported, else the reason it is not.
CapabilityCheck = Callable[[GDNShape, torch.dtype, torch.device], str | None]


def supports_everything(shape: GDNShape, dtype: torch.dtype, device: torch.device) -> str | None:
    """The check of a backend that declares none: every valid request is its to answer."""
    return None


@dataclass(frozen=True)
class Backend:
    """A named core backend. `module` is the import its code comes from (the provenance looks up
    its distribution); `options` are the extra keywords it accepts beyond the protocol
    (`chunk_size`, `on_final_state`, `on_initial_state_grad`), each refused by the others."""

    name: str
    fn: CoreFn
    check: CapabilityCheck = supports_everything
    module: str | None = None
    distribution: str | None = None  # set for entry points; else looked up from `module`
    options: frozenset[str] = field(default_factory=frozenset)
    description: str = ""

    def unsupported(self, shape: GDNShape, dtype: torch.dtype, device: torch.device) -> str | None:
        """The reason this backend cannot run the request, or None."""
        return self.check(shape, dtype, torch.device(device))
