"""Numerics of a state walk that steps over several chunks at once, on the CPU.

A chunk of the gated delta rule maps its entering state S to S' = A·S + B, with
A = e^{γ_C}·I − K̃ᵀ·Wk and B = K̃ᵀ·U (K̃ = K ⊙ e^{γ_C−γ}; Wk and U the WY operands,
docs/kernels.md). k chunks compose into one map: A_g = A_{k−1}···A_0 and
B_g = A_{k−1}···A_1·B_0 + … + B_{k−1}, formed chunk-parallel; the sequential walk then takes one
step per group instead of one per chunk. Whether that keeps the states as accurate as the
per-chunk walk depends on how the products round. This probe computes the per-chunk maps in fp64
from the inputs the suites use (l2-normalised k, β = sigmoid(randn), g = logsigmoid(randn + b)
with b = 2: e^{γ_C} ≈ 1e-5 over a chunk, so a state keeps little of the previous chunk; a larger
b keeps more, b = 8 about 75 % per chunk), then walks the states three ways against the fp64 per-chunk walk:

- `chunk`: one step per chunk, every matmul operand rounded as the tensor cores take it;
- `group k`: the composed maps (their products rounded the same way, fp32 accumulation), then
  one step per group of k chunks;
- each reports the worst relative Frobenius error of the state at every group boundary and at
  the end.

`--operands tf32` rounds operands to 10 mantissa bits (tf32), `bf16` to bfloat16, `fp32` not at
all. Prints one row per (operands, walk). A model of the rounding, not a device measurement:

    python benchmarks/multichunk_walk_probe.py --seq-len 8192 --heads 2 --groups 1,4,16
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

BT = 64


def rounded(x: torch.Tensor, operands: str) -> torch.Tensor:
    """x as a tensor-core operand: bf16, tf32 (10 mantissa bits, round to nearest) or fp32."""
    if operands == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    if operands == "tf32":
        f = x.to(torch.float32)
        bits = f.view(torch.int32)
        bits = (bits + 0x1000) & ~0x1FFF  # keep 10 of 23 mantissa bits, round half up
        return bits.view(torch.float32).to(x.dtype)
    return x.to(torch.float32).to(x.dtype)


def mm(a: torch.Tensor, b: torch.Tensor, operands: str) -> torch.Tensor:
    """A tensor-core product: operands rounded, fp32 accumulation."""
    return rounded(a, operands).to(torch.float32) @ rounded(b, operands).to(torch.float32)


def chunk_maps(T: int, heads: int, D: int, seed: int, gate_bias: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-chunk maps in fp64: A [H, NT, D, D] and B [H, NT, D, D]."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(heads, T, D, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(heads, T, D, generator=gen, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(heads, T, generator=gen, dtype=torch.float64))
    g = torch.nn.functional.logsigmoid(torch.randn(heads, T, generator=gen, dtype=torch.float64) + gate_bias)
    nt = T // BT
    A = torch.empty(heads, nt, D, D, dtype=torch.float64)
    B = torch.empty_like(A)
    eye_c = torch.eye(BT, dtype=torch.float64)
    eye_d = torch.eye(D, dtype=torch.float64)
    strict = torch.ones(BT, BT, dtype=torch.bool).tril(-1)
    for c in range(nt):
        rows = slice(c * BT, (c + 1) * BT)
        kc, vc, bc = k[:, rows], v[:, rows], beta[:, rows]
        gam = g[:, rows].cumsum(-1)
        diff = gam[:, :, None] - gam[:, None, :]
        decay = torch.where(strict, diff, torch.zeros_like(diff)).exp() * strict
        L = bc[:, :, None] * (kc @ kc.transpose(-1, -2)) * decay
        tmat = torch.linalg.inv(eye_c + L)
        u = tmat @ (bc[:, :, None] * vc)
        wk = tmat @ ((bc * gam.exp())[:, :, None] * kc)
        last = gam[:, -1:]
        kd = kc * (last - gam).exp()[:, :, None]
        A[:, c] = last.exp()[:, :, None] * eye_d - kd.transpose(-1, -2) @ wk
        B[:, c] = kd.transpose(-1, -2) @ u
    return A, B


def walk_errors(A: torch.Tensor, B: torch.Tensor, group: int, operands: str) -> tuple[float, float]:
    """Worst relative error of the state at group boundaries and at the end, walking groups of
    `group` chunks with maps composed in the rounded arithmetic, against the fp64 walk."""
    heads, nt, D, _ = A.shape
    S64 = torch.zeros(heads, D, D, dtype=torch.float64)
    truth = []
    for c in range(nt):
        S64 = A[:, c] @ S64 + B[:, c]
        if (c + 1) % group == 0 or c == nt - 1:
            truth.append(S64.clone())
    A32, B32 = A.to(torch.float32), B.to(torch.float32)
    S = torch.zeros(heads, D, D, dtype=torch.float32)
    worst = 0.0
    for i, c0 in enumerate(range(0, nt, group)):
        Ag, Bg = A32[:, c0], B32[:, c0]
        for c in range(c0 + 1, min(c0 + group, nt)):  # chunk-parallel on a device
            Ag = mm(A32[:, c], Ag, operands)
            Bg = mm(A32[:, c], Bg, operands) + B32[:, c]
        S = mm(Ag, S, operands) + Bg  # a group of one chunk is that chunk's own map
        err = ((S.double() - truth[i]).norm() / truth[i].norm()).item()
        worst = max(worst, err)
    return worst, err


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--groups", default="1,2,4,8,16", help="chunks per walk step, comma-separated")
    ap.add_argument("--operands", default="tf32,bf16,fp32", help="operand roundings, comma-separated")
    ap.add_argument("--gate-biases", default="2,5,8", help="b of g = logsigmoid(randn + b), comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.seq_len < BT or args.seq_len % BT:
        ap.error(f"--seq-len {args.seq_len}: expected a positive multiple of {BT}")
    groups = [int(x) for x in args.groups.split(",") if x]
    if any(x < 1 for x in groups):
        ap.error(f"--groups {args.groups}: expected positive integers")
    print(f"T={args.seq_len} heads={args.heads} D={args.head_dim} chunks={args.seq_len // BT} "
          f"seed={args.seed}")
    print(f"{'gate b':>6s} {'e^γ_C':>8s} {'operands':8s} {'walk':9s} {'steps':>6s} {'worst boundary':>15s} "
          f"{'final':>10s}")
    for bias in (float(x) for x in args.gate_biases.split(",") if x):
        A, B = chunk_maps(args.seq_len, args.heads, args.head_dim, args.seed, bias)
        keep = A.diagonal(dim1=-2, dim2=-1).mean().item()  # e^{γ_C} less the small rank-64 part
        for operands in args.operands.split(","):
            for group in groups:
                worst, final = walk_errors(A, B, group, operands)
                name = "chunk" if group == 1 else f"group {group}"
                steps = math.ceil(A.shape[1] / group)
                print(f"{bias:6g} {keep:8.2e} {operands:8s} {name:9s} {steps:6d} {worst:15.3e} {final:10.3e}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
