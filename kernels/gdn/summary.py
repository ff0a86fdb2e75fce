"""The CP state summary: final state only (gate, intra and state stages; no output, no
per-chunk states). S_end = M·S_in + S_ext with
  M     = state_summary(k, v, g, beta, initial_state=I, zero_values=True)   (v is not read)
  S_ext = state_summary(k, v, g, beta)                                   (zero initial state)
(the identity is dk×dk and dk = dv = 128). Forward-only; gdn/cp/summary.py adds the backward."""

from __future__ import annotations

import torch

from kernels.gdn.config import KernelConfig, kernel_config
from kernels.gdn.gate import gate_cumsum
from kernels.gdn.intra import intra_solve
from kernels.gdn.state import state_forward


@torch.no_grad()
def state_summary(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    zero_values: bool = False,
    config: KernelConfig | None = None,
) -> torch.Tensor:
    """Final state [B, Hv, 128, 128] fp32 only: no output, no per-chunk states (forward-only).

    zero_values=True runs with V = 0 (v is not read), so with initial_state = I it gives the
    chunk-transition product M of S_end = M·S_in + S_ext; see the module docstring."""
    cfg = config or kernel_config(k.dtype, k.device)
    Hv = v.shape[2]
    k, beta = k.contiguous(), beta.contiguous()
    gamma = gate_cumsum(g.contiguous())
    w, u, _ = intra_solve(k, None if zero_values else v.contiguous(), beta, gamma, Hv, cfg=cfg)
    h0 = None if initial_state is None else initial_state.float().contiguous()
    _, _, ht, _ = state_forward(
        k, w, u, gamma, Hv, h0, store_states=False, store_vn=False, store_final=True, cfg=cfg
    )
    return ht
