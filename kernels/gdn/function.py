"""The autograd Function: wires the stages of the forward and the backward, nothing else."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.gdn.chunks import ChunkTable, table_parts
from kernels.gdn.config import D, KernelConfig, kernel_config
from kernels.gdn.dqk import bwd_dqk
from kernels.gdn.fused_bwd import fused_backward
from kernels.gdn.fused_fwd import fused_forward
from kernels.gdn.gate import gate_cumsum
from kernels.gdn.intra import intra_solve, intra_t, intra_wu
from kernels.gdn.output import output
from kernels.gdn.state import state_backward, state_forward
from kernels.gdn.wy_bwd import bwd_wy

StateCallback = Callable[[torch.Tensor], None]


def _saved_tensors_hook_active() -> bool:
    """True inside `torch.autograd.graph.saved_tensors_hooks` (non-reentrant activation
    checkpointing installs one): what the forward keeps must then go through the hook or not at
    all. False when this torch build does not expose the query."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is not None and top(False) is not None


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
    scale: float, initial_state: torch.Tensor | None, output_final_state: bool, keep: bool,
    cfg: KernelConfig, on_final_state: StateCallback | None = None, table: ChunkTable | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """o, the final state and, when `keep`, what the backward takes: (Wk (None under walk_vn "t"
    or walk_wk), T, per-chunk S, Vn, segment maps or None), or with cfg.fused (T, the group
    states, the segment maps or None, chunks per segment). `table`: the chunk table of packed
    sequences (`varlen`): every stage reads and writes the packed rows chunk by chunk through it,
    and the state passes restart at every sequence.
    `on_final_state(ht)` runs as soon as the state pass has the final state, before the output
    stage is launched (a CP chain can send it on while the output is computed)."""
    Hv = v.shape[2]
    if cfg.fused:  # kept: T, the group states, the segment maps, chunks per segment
        check_dense(table)
        tm = intra_t(k, beta, gamma, Hv, cfg=cfg)
        o, ht, fkept = fused_forward(q, k, v, beta, gamma, tm, scale, initial_state,
                                     store_final=output_final_state, keep=keep, cfg=cfg)
        if on_final_state is not None and ht is not None:
            on_final_state(ht)
        return o, ht, ((tm, *fkept) if keep else ())
    w, tm, s, vn, ht, maps = _walk(k, v, beta, gamma, initial_state, output_final_state, keep, cfg, table)
    if on_final_state is not None and ht is not None:
        on_final_state(ht)
    o = output(q, k, vn, s, gamma, Hv, scale, v.dtype, table_parts(table)[0], cfg=cfg)
    return o, ht, ((w, tm, s, vn, maps) if keep else ())


def _walk(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor,
    initial_state: torch.Tensor | None, store_final: bool, keep: bool, cfg: KernelConfig,
    table: ChunkTable | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor | None,
           torch.Tensor | None]:
    """The staged path's solve and forward state pass: Wk (None under walk_vn "t" or walk_wk), T (when
    `keep`), per-chunk S, Vn, the final state (when `store_final`) and the segment maps (when
    `keep` and split). cfg.walk_vn says what the intra stage writes for the walk: Wk and U
    ("load"), Wk ("u": the walk forms U), nothing but T ("t": the walk forms Vn from T)."""
    spans, seq_chunks = table_parts(table)
    mode = cfg.walk_vn
    if mode not in ("load", "u", "t"):
        raise ValueError(f"walk_vn = {mode!r}: expected 'load', 'u' or 't'")
    if mode == "t":
        w, u, tm = None, None, intra_t(k, beta, gamma, v.shape[2], spans=spans, cfg=cfg)
    else:
        w, u, tm = intra_solve(k, v if mode == "load" else None, beta, gamma, v.shape[2],
                               store_t=keep or mode == "u", spans=spans, cfg=cfg)
    s, vn, ht, maps = state_forward(
        k, w, u, gamma, v.shape[2], initial_state, store_states=True, store_vn=True, store_final=store_final,
        keep_maps=keep, vn_from=None if mode == "load" else (v, beta, tm), seq_chunks=seq_chunks,
        spans=spans, cfg=cfg,
    )
    # walk_wk: the reverse walk forms Wk from T, so none is handed on
    return None if cfg.walk_wk else w, tm if keep else None, s, vn, ht, maps


class GatedDeltaRuleFunction(torch.autograd.Function):
    """Autograd wiring of the stages.

    By default the forward keeps Wk, T, the per-chunk states and Vn for the backward: it writes
    them anyway, and recomputing them costs a second sequential state pass (measured ~2 ms of a
    64K fwd+bwd on an H200). They are held on ctx rather than by save_for_backward so that the
    backward can drop each one as soon as its last stage has run (Wk and the segment maps after
    the reverse pass, S after bwd_dqk, whose dk partial and dWk take dS' and Vn's memory), which
    lowers the backward's peak. A second backward through the same graph (retain_graph) finds
    them gone and recomputes them. So does a forward under a saved-tensors hook, which keeps only
    the inputs and γ (an activation checkpoint drops the saved tensors and re-runs the forward,
    but would never see what ctx holds). The forward's config is kept on ctx, so the backward
    launches with the same settings."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        scale: float, initial_state: torch.Tensor | None, output_final_state: bool,
        on_final_state: StateCallback | None = None, on_initial_state_grad: StateCallback | None = None,
        table: ChunkTable | None = None, cfg: KernelConfig | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        cfg = cfg or kernel_config(q.dtype, q.device)
        gamma = gate_cumsum(g, table_parts(table)[0])
        keep = not _saved_tensors_hook_active()
        o, ht, kept = _forward(
            q, k, v, gamma, beta, scale, initial_state, output_final_state, keep, cfg, on_final_state,
            table,
        )
        ctx.save_for_backward(q, k, v, beta, gamma, initial_state)
        ctx.kept = list(kept) if keep else None  # intermediates, not inputs or outputs
        ctx.scale = scale
        ctx.g_dtype = g.dtype
        ctx.on_initial_state_grad = on_initial_state_grad
        ctx.table = table
        ctx.cfg = cfg
        return o, ht

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, do: torch.Tensor | None, dht: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        q, k, v, beta, gamma, h0 = ctx.saved_tensors
        Hv = v.shape[2]
        do = torch.zeros_like(v) if do is None else do.contiguous().to(v.dtype)
        dht = None if dht is None else dht.contiguous().float()
        kept, ctx.kept = ctx.kept, None
        table, cfg = ctx.table, ctx.cfg
        if cfg.fused:
            if not kept:
                kept = _forward(q, k, v, gamma, beta, ctx.scale, h0, False, True, cfg)[2]
            tm, *fkept = kept
            del kept
            dq, dk, dv, dg, dbeta, dh0 = fused_backward(
                q, k, v, beta, gamma, tm, tuple(fkept), do, dht, ctx.scale, ctx.g_dtype,
                want_dh0=h0 is not None, cfg=cfg,
            )
            if ctx.on_initial_state_grad is not None and dh0 is not None:
                ctx.on_initial_state_grad(dh0)
            dh0 = None if dh0 is None else dh0.to(h0.dtype)
            return dq, dk, dv, dg, dbeta, None, dh0, None, None, None, None, None
        spans, seq_chunks = table_parts(table)
        if kept:
            w, tm, s, vn, maps = kept
            del kept
        else:
            w, tm, s, vn, _, maps = _walk(k, v, beta, gamma, h0, False, True, cfg, table)
        if w is None and not cfg.walk_wk:  # walk_vn "t": no Wk was written; the reverse walk reads it
            w, _ = intra_wu(k, None, beta, gamma, tm, spans=spans, cfg=cfg)
        ds, dvn, dh0 = state_backward(
            q, k, w, do, gamma, dht, ctx.scale, want_dh0=h0 is not None, maps=maps,
            seq_chunks=seq_chunks, spans=spans, wk_from=(beta, tm) if cfg.walk_wk else None, cfg=cfg,
        )
        if ctx.on_initial_state_grad is not None and dh0 is not None:
            ctx.on_initial_state_grad(dh0)  # before the input-gradient stages are launched
        del maps, w  # bwd_dqk does not read Wk
        dq, dkp, dw, dgam = bwd_dqk(q, k, Hv, gamma, s, ds, vn, dvn, do, ctx.scale, spans, cfg=cfg)
        del s, ds, vn  # overwritten by bwd_dqk; dkp and dw may hold the memory of the last two
        dk, dv, dbeta, dg = bwd_wy(k, v, beta, ctx.g_dtype, gamma, tm, dw, dvn, dkp, dgam, spans, cfg=cfg)
        del tm, dw, dvn, dkp, dgam
        if dh0 is not None:
            dh0 = dh0.to(h0.dtype)
        return dq, dk, dv, dg, dbeta, None, dh0, None, None, None, None, None


def gated_delta_rule_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    on_final_state: StateCallback | None = None,
    on_initial_state_grad: StateCallback | None = None,
    config: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule, [B, T, H, 128] layout, grouped heads native; returns (o, final_state | None).

    Inputs are validated by `gdn.ops.gated_delta_rule`; this checks only what the kernels assume.
    The callbacks receive the final state (fp32) as soon as the forward's state pass has it, and
    the initial state's gradient (fp32) as soon as the backward's reverse state pass has it: the
    points a context-parallel state chain waits on, ahead of the stages that follow them.
    `config`: the launch settings (default: `config.kernel_config` of q's dtype).
    """
    check_heads(q, v)
    return run_chunked(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        on_final_state=on_final_state, on_initial_state_grad=on_initial_state_grad, config=config,
    )


def check_dense(table: ChunkTable | None) -> None:
    """The fused kernels walk dense sequences only: packed ones are refused, not rerouted."""
    if table is not None:
        raise ValueError("KernelConfig.fused = True takes dense sequences; packed sequences (cu_seqlens) "
                         "run the staged kernels: leave fused off for them")


def check_heads(q: torch.Tensor, v: torch.Tensor) -> None:
    """What the kernels assume of the head layout (the rest is validated by `gdn.ops`)."""
    if q.shape[-1] != D or v.shape[-1] != D:
        raise ValueError(f"head_dim must be {D}, got q {q.shape[-1]} and v {v.shape[-1]}")
    if v.shape[2] % q.shape[2]:
        raise ValueError(f"Hv={v.shape[2]} is not a multiple of Hqk={q.shape[2]}")


def run_chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
    scale: float | None, initial_state: torch.Tensor | None, output_final_state: bool,
    on_final_state: StateCallback | None = None, on_initial_state_grad: StateCallback | None = None,
    table: ChunkTable | None = None, config: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The stages on checked inputs, through the autograd Function when a backward can follow.
    `table`: the chunk table of packed sequences (`varlen`), one state each."""
    cfg = config or kernel_config(q.dtype, q.device)
    scale = D**-0.5 if scale is None else float(scale)
    h0 = None if initial_state is None else initial_state.float().contiguous()
    inputs = (q, k, v, g, beta, h0)
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in inputs):
        # No backward can follow: nothing is kept for one.
        o, ht, _ = _forward(
            q.contiguous(), k.contiguous(), v.contiguous(),
            gate_cumsum(g.contiguous(), table_parts(table)[0]), beta.contiguous(),
            scale, h0, output_final_state, keep=False, cfg=cfg, on_final_state=on_final_state, table=table,
        )
        return o, ht
    o, ht = GatedDeltaRuleFunction.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
        scale, h0, output_final_state, on_final_state, on_initial_state_grad, table, cfg,
    )
    return o, ht
