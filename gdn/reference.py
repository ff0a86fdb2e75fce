"""The two torch implementations of the gated delta rule that everything else is checked against.

* `recurrent_gated_delta_rule`: the per-token recurrence, written as the definition reads. It is
  the oracle: run it in fp64 (small shapes) or fp32 and compare any backend against it.
* `chunk_gated_delta_rule_eager`: the chunked form (chunk 64, WY/UT transform inside a chunk, a
  Python loop over chunks, autograd for the backward). This is the "eager" backend of the report.

Layout is [B, T, H, D]; q/k carry Hqk heads and serve Hv = r·Hqk value heads (value head h reads
q/k head h // r, the `repeat_interleave` convention of the ecosystem).
"""

from __future__ import annotations

import torch

from gdn.device import autocast_off
from gdn.packing import per_sequence


def _grouped(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """[B, T, Hqk, D] -> [B, Hv, T, D], each q/k head serving Hv // Hqk value heads."""
    rep = num_v_heads // x.shape[2]
    x = x.transpose(1, 2)
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def _head_major(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial_state: torch.Tensor | None, dtype: torch.dtype,
) -> tuple[torch.Tensor, ...]:
    """(q, k, v, g, β) as [B, Hv, T, ...] in `dtype` and the starting state (zeros when None)."""
    B, _, Hv, Dv = v.shape
    Dk = q.shape[-1]
    qh, kh = _grouped(q.to(dtype), Hv), _grouped(k.to(dtype), Hv)
    vh = v.to(dtype).transpose(1, 2)
    gh, bh = g.to(dtype).transpose(1, 2), beta.to(dtype).transpose(1, 2)
    S = (
        initial_state.to(dtype)
        if initial_state is not None
        else torch.zeros(B, Hv, Dk, Dv, dtype=dtype, device=v.device)
    )
    return qh, kh, vh, gh, bh, S


def recurrent_gated_delta_rule(
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token recurrence in the dtype of `v` (callers pass fp32 or fp64).

    S_t = exp(g_t)·(I − β_t k_t k_tᵀ)·S_{t−1} + β_t k_t v_tᵀ,   o_t = scale · S_tᵀ q_t.
    With `cu_seqlens` (checked by the caller, gdn.packing) each packed sequence runs alone.
    """
    if cu_seqlens is not None:
        return per_sequence(
            recurrent_gated_delta_rule, q, k, v, g, beta, cu_seqlens=cu_seqlens, scale=scale,
            initial_state=initial_state, output_final_state=output_final_state,
        )
    with autocast_off(v.device):  # fp32 math even inside a bf16 autocast region
        T = v.shape[1]
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        qh, kh, vh, gh, bh, S = _head_major(q, k, v, g, beta, initial_state, v.dtype)
        outs = []
        for t in range(T):
            k_t, v_t, b_t = kh[:, :, t], vh[:, :, t], bh[:, :, t, None]
            S = S * gh[:, :, t, None, None].exp()
            delta = b_t * (v_t - torch.einsum("bhkv,bhk->bhv", S, k_t))
            S = S + k_t[..., :, None] * delta[..., None, :]
            outs.append(torch.einsum("bhkv,bhk->bhv", S, qh[:, :, t]) * scale)
        o = torch.stack(outs, dim=2).transpose(1, 2) if T else v.new_zeros(v.shape)
        return o, (S if output_final_state else None)


def chunk_gated_delta_rule_eager(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule with a Python loop over chunks; autograd gives the backward.

    Inside a chunk with local cumulative gates γ (γ_i = Σ_{j≤i} g_j) and incoming state S0:
      W  = (I + L)⁻¹ · (diag(β)·V − diag(β·e^γ)·K·S0),   L_ij = β_i·e^{γ_i−γ_j}·k_i·k_j (j < i)
      O  = scale · (diag(e^γ)·Q·S0 + (Q·Kᵀ ⊙ e^{γ_i−γ_j}, j ≤ i)·W)
      S1 = e^{γ_C}·S0 + (K ⊙ e^{γ_C−γ})ᵀ·W
    Compute runs in fp32 for half-precision inputs and in the input dtype otherwise; the output is
    returned in v's dtype and the final state in fp32 (fp64 when the inputs are fp64).
    With `cu_seqlens` each packed sequence runs alone, with its own chunk grid and state.
    """
    if cu_seqlens is not None:
        return per_sequence(
            chunk_gated_delta_rule_eager, q, k, v, g, beta, cu_seqlens=cu_seqlens, scale=scale,
            initial_state=initial_state, output_final_state=output_final_state, chunk_size=chunk_size,
        )
    with autocast_off(v.device):  # fp32 math even inside a bf16 autocast region
        B, T, Hv, Dv = v.shape
        out_dtype = v.dtype
        dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        qh, kh, vh, gh, bh, S = _head_major(q, k, v, g, beta, initial_state, dtype)
        outs = []
        for start in range(0, T, chunk_size):
            end = min(start + chunk_size, T)
            C = end - start
            q_c, k_c, v_c = qh[:, :, start:end], kh[:, :, start:end], vh[:, :, start:end]
            b_c = bh[:, :, start:end]
            gamma = gh[:, :, start:end].cumsum(-1)  # [B, H, C]
            strict = torch.ones(C, C, dtype=torch.bool, device=v.device).tril(-1)
            causal = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()
            diff = gamma[..., :, None] - gamma[..., None, :]
            # Mask before exp: the upper triangle holds positive differences that may overflow.
            decay = torch.where(causal, diff, torch.zeros_like(diff)).exp() * causal
            L = (b_c[..., :, None] * (k_c @ k_c.transpose(-1, -2)) * decay) * strict
            eye = torch.eye(C, dtype=dtype, device=v.device)
            rhs = b_c[..., None] * v_c - (b_c * gamma.exp())[..., None] * (k_c @ S)
            W = torch.linalg.solve_triangular(eye + L, rhs, upper=False, unitriangular=True)
            o_c = (gamma.exp()[..., None] * (q_c @ S) + ((q_c @ k_c.transpose(-1, -2)) * decay) @ W) * scale
            outs.append(o_c)
            g_last = gamma[..., -1:]
            S = g_last.exp()[..., None] * S + (k_c * (g_last - gamma).exp()[..., None]).transpose(-1, -2) @ W
        o = torch.cat(outs, dim=2) if outs else vh.new_zeros(B, Hv, 0, Dv)
        return o.transpose(1, 2).to(out_dtype), (S if output_final_state else None)
