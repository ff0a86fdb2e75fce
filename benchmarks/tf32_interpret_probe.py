"""Which fp32-operand dot groups need more than tf32? Answered on CPU, without a GPU.

Triton's interpreter computes every `tl.dot` in full fp32 whatever its `input_precision`. This
probe makes it round both fp32 operands of a `"tf32"` dot to tf32 (10 mantissa bits, nearest
even, as the tensor cores read them), leaves `"tf32x3"` and `"ieee"` exact, runs our kernels under
`TRITON_INTERPRET=1` with fp16 inputs (the interpreter cannot do bf16 dots) against the fp64
eager backend, and prints each tensor's relative L2 for several precision settings: all tf32,
all tf32x3, and tf32x3 in one dot group only (the config field `f32_dot_<group>`).

    TRITON_INTERPRET=1 python benchmarks/tf32_interpret_probe.py [--seq-len 512] [--heads 2]

fp16 inputs put the storage floor ~8x below bf16's, so tf32 rounding shows clearly here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROUPS = ("tm", "wu", "wy_dt", "wy_da", "wy_dx")
NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")
TRUNCATE = False


def _patch_interpreter_tf32() -> None:
    from triton._C.libtriton import ir
    from triton.runtime import interpreter as interp

    original = interp.InterpreterBuilder.create_dot

    def to_tf32(x: np.ndarray) -> np.ndarray:
        if TRUNCATE:  # drop the 13 low mantissa bits, as feeding raw fp32 bits to a tf32 MMA does
            return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
        return interp._round_f32_to_tf32(x)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32:
            if a.data.dtype == np.float32:
                a = interp.TensorHandle(to_tf32(a.data), a.dtype.scalar)
            if b.data.dtype == np.float32:
                b = interp.TensorHandle(to_tf32(b.data), b.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    interp.InterpreterBuilder.create_dot = create_dot


def _errors(seq_len: int, heads: int, seed: int) -> dict[str, float]:
    from gdn import gated_delta_rule
    from tests.support.gdn_inputs import make_inputs, rel_l2

    x64 = make_inputs(1, seq_len, heads, heads, 128, dtype=torch.float64, stateful=False, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    do = torch.randn(x64.v.shape, generator=gen, dtype=torch.float64)
    ref_in = [t.clone().requires_grad_() for t in (x64.q, x64.k, x64.v, x64.g, x64.beta)]
    o_ref, _ = gated_delta_rule(*ref_in, backend="eager")
    ref = [o_ref, *torch.autograd.grad(o_ref, ref_in, do)]
    half = [
        (t.to(torch.float16) if i != 3 else t.float()).detach().requires_grad_()
        for i, t in enumerate((x64.q, x64.k, x64.v, x64.g, x64.beta))
    ]
    o, _ = gated_delta_rule(*half, backend="triton")
    got = [o, *torch.autograd.grad(o, half, do.to(o.dtype))]
    return {n: rel_l2(a, b) for n, a, b in zip(NAMES, got, ref, strict=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--truncate", action="store_true", help="tf32 by truncation instead of rounding")
    args = ap.parse_args()
    global TRUNCATE
    TRUNCATE = args.truncate
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1 (the probe patches the CPU interpreter)")
    _patch_interpreter_tf32()
    import kernels.gdn as kg

    settings = {"all tf32": {"f32_dot": "tf32"}, "all tf32x3": {"f32_dot": "tf32x3"}}
    for g in GROUPS:
        settings[f"tf32, {g} tf32x3"] = {"f32_dot": "tf32", f"f32_dot_{g}": "tf32x3"}
        settings[f"tf32x3, {g} tf32"] = {"f32_dot": "tf32x3", f"f32_dot_{g}": "tf32"}
    for label, tuning in settings.items():
        with kg.config_overrides(**({f"f32_dot_{g}": "" for g in GROUPS} | tuning)):
            e = _errors(args.seq_len, args.heads, args.seed)
        print(f"{label:24s} " + " ".join(f"{n}={v:.2e}" for n, v in e.items()), flush=True)


if __name__ == "__main__":
    main()
