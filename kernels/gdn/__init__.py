"""Chunked gated delta rule in Triton, one module per stage (the layout of flash-linear-attention's
`fla/ops/gated_delta_rule/` and `fla/ops/common/`).

Layout [B, T, H, D] with D = 128 (dk = dv), chunk 64; q/k have Hqk heads and serve Hv = r·Hqk
value heads natively (value head h reads q/k head h // r, never a materialised repeat).

  config     KernelConfig (immutable launch settings per dtype), chunk and head sizes, dot precision
  common     device helpers shared by the stages
  gate       γ = chunk-local cumulative log gates
  intra      T = (I + A)⁻¹, Wk = T·(β e^γ K), U = T·(β V)
  segments   per-segment affine maps of the state and the scan across segments
  state      forward / reverse state passes (sequence-parallel over segments when it pays)
  output     O from per-chunk states and Vn
  fused_fwd  the fused forward: one walk per head, Vn and O on chip, T and group states kept
  fused_bwd  the fused backward: the reverse walk and the whole WY backward per chunk on chip
  dvn_local  the intra-chunk part of dVn
  dqk        dq, the state part of dk, dWk and γ partials
  wy_bwd     dk, dv, dβ, dg through the WY representation
  function   the autograd Function (wiring only) and `gated_delta_rule_triton`
  summary    the CP state summary (`state_summary`)
  varlen     packed sequences (`cu_seqlens`): chunk-aligned packing, one launch chain for all

The packed offsets' rule is `kernels.offsets` (torch only). The algebra is in docs/kernels.md, the
measurements behind the settings in docs/decisions/.
"""

from kernels.gdn.config import BT, D, KernelConfig, config_overrides, kernel_config, override_for_run, t_dtype
from kernels.gdn.dqk import bwd_dqk
from kernels.gdn.dvn_local import dvn_local
from kernels.gdn.function import GatedDeltaRuleFunction, gated_delta_rule_triton
from kernels.gdn.gate import gate_cumsum
from kernels.gdn.intra import intra_solve
from kernels.gdn.output import output
from kernels.gdn.segments import segment_forward_summary, segment_scan, state_segments
from kernels.gdn.state import state_backward, state_forward
from kernels.gdn.summary import state_summary
from kernels.gdn.varlen import gated_delta_rule_triton_varlen
from kernels.gdn.wy_bwd import bwd_wy

__all__ = [
    "BT",
    "D",
    "GatedDeltaRuleFunction",
    "KernelConfig",
    "bwd_dqk",
    "bwd_wy",
    "config_overrides",
    "dvn_local",
    "gate_cumsum",
    "gated_delta_rule_triton",
    "gated_delta_rule_triton_varlen",
    "intra_solve",
    "kernel_config",
    "output",
    "override_for_run",
    "segment_forward_summary",
    "segment_scan",
    "state_backward",
    "state_forward",
    "state_segments",
    "state_summary",
    "t_dtype",
]
