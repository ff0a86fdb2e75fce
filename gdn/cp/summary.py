"""Shard summaries: the final state of a shard is affine in its initial state.

For one head, S_end = M·S_in + S_ext, where M (dk×dk) is the product of the shard's token
transitions exp(g_t)·(I − β_t k_t k_tᵀ) and S_ext (dk×dv) is the final state from a zero initial
state. Both come from ordinary gated-delta-rule calls, so every backend that returns a final state
(and its gradient) gives exact, differentiable summaries:

* M = final state of a run with v = 0 and initial_state = I (the value path is then linear in I);
* S_ext = final state of a run from a zero state.

The eager backend does both in one call by concatenating along the value dim ([0 | v] with
initial state [I | 0]). The Triton backend (head_dim fixed at 128) runs the kernels' forward-only
summary (`kernels.gdn.state_summary`: no output, no per-chunk states) twice; its backward
recomputes the two final states through the differentiable Triton op and takes their gradients,
so the forward critical path of P2P pays no output pass for the summary.
"""

from __future__ import annotations

import torch

from gdn.device import autocast_off
from gdn.ops import gated_delta_rule


def state_dtype(x: torch.Tensor) -> torch.dtype:
    """States and chains stay in fp32 (fp64 for fp64 inputs), whatever the activations' dtype."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def identity_state(B: int, H: int, dk: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.eye(dk, dtype=dtype, device=device).expand(B, H, dk, dk).contiguous()


def state_summary(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    backend: str,
    chunk_size: int = 64,
    need_transition: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(M [B, Hv, dk, dk] or None, S_ext [B, Hv, dk, dv]) of one shard, differentiable in all inputs."""
    B, _, Hv, dv = v.shape
    dk = k.shape[-1]
    sdt = state_dtype(v)
    if not need_transition:
        _, ext = gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, backend=backend, chunk_size=chunk_size
        )
        return None, ext
    eye = identity_state(B, Hv, dk, sdt, v.device)
    if backend == "eager":
        v_cat = torch.cat([v.new_zeros(*v.shape[:3], dk), v], dim=-1)
        s0 = torch.cat([eye, eye.new_zeros(B, Hv, dk, dv)], dim=-1)
        _, s = gated_delta_rule(
            q, k, v_cat, g, beta, initial_state=s0, output_final_state=True, backend=backend,
            chunk_size=chunk_size,
        )
        return s[..., :dk], s[..., dk:]
    if dk != dv:
        raise ValueError(f"the transition summary needs dk == dv on backend {backend!r}, got {dk} and {dv}")
    if backend == "triton":
        m, ext = _TritonSummary.apply(q, k, v, g, beta, chunk_size)
        return m, ext
    _, m = gated_delta_rule(
        q, k, v.new_zeros(v.shape), g, beta, initial_state=eye, output_final_state=True,
        backend=backend, chunk_size=chunk_size,
    )
    _, ext = gated_delta_rule(
        q, k, v, g, beta, output_final_state=True, backend=backend, chunk_size=chunk_size
    )
    return m, ext


class _TritonSummary(torch.autograd.Function):
    """(M, S_ext) from the forward-only summary kernels; backward through the differentiable op."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, chunk_size: int):  # type: ignore[override]
        from kernels.gdn import state_summary as kernel_summary

        B, _, Hv, _ = v.shape
        eye = identity_state(B, Hv, k.shape[-1], torch.float32, v.device)
        m = kernel_summary(k, v, g, beta, initial_state=eye, zero_values=True)
        ext = kernel_summary(k, v, g, beta)
        ctx.save_for_backward(q, k, v, g, beta)
        ctx.chunk_size = chunk_size
        return m, ext

    @staticmethod
    def backward(ctx, d_m, d_ext):  # type: ignore[override]
        q, k, v, g, beta = ctx.saved_tensors
        cs = ctx.chunk_size
        with torch.enable_grad():
            ins = [t.detach().requires_grad_(True) for t in (q, k, v, g, beta)]
            qi, ki, vi, gi, bi = ins
            eye = identity_state(v.shape[0], v.shape[2], k.shape[-1], torch.float32, v.device)
            _, m = gated_delta_rule(
                qi, ki, vi.new_zeros(vi.shape), gi, bi, initial_state=eye, output_final_state=True,
                backend="triton", chunk_size=cs,
            )
            _, ext = gated_delta_rule(
                qi, ki, vi, gi, bi, output_final_state=True, backend="triton", chunk_size=cs
            )
            outs, grads = [], []
            for t, d in ((m, d_m), (ext, d_ext)):
                if d is not None:
                    outs.append(t)
                    grads.append(d)
            got = torch.autograd.grad(outs, ins, grads, allow_unused=True)
        return (*got, None)


def apply_transition(m: torch.Tensor, s: torch.Tensor, ext: torch.Tensor) -> torch.Tensor:
    """S_out = M·S_in + S_ext per head, in the state dtype (also inside a bf16 autocast region)."""
    with autocast_off(m.device):
        return m @ s.to(m.dtype) + ext


def merge_prefix(ms: list[torch.Tensor | None], exts: list[torch.Tensor]) -> torch.Tensor:
    """The state entering shard len(exts): fold S ← M_j·S + S_ext_j over the earlier shards.

    `ms[0]` may be None (shard 0 starts from zero, so its M is never needed).
    """
    s = exts[0]
    for m, ext in zip(ms[1:], exts[1:], strict=True):
        s = apply_transition(m, s, ext)  # type: ignore[arg-type]
    return s
