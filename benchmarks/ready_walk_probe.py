"""Which launch of an unpipelined walk on operands formed ahead goes out of bounds? (one GPU)

On the H200 (Triton 3.6, bf16) the state walks with `walk_operands = 1` ran at 3 software-pipelining
stages and stopped with an illegal memory access at 1 (`state.walk_stages` refuses that setting
since). This probe lifts the refusal for its own process, runs each launch of both state passes
alone at the stage count given, synchronising after each, and prints which one fails. Run it under
the CUDA toolkit's compute-sanitizer to get the faulting instruction and address:

    compute-sanitizer --tool memcheck python3 benchmarks/ready_walk_probe.py --seq-len 4096 --stages 1

Exits 1 when a launch fails (a probe: the GPU tests are the check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--stages", type=int, default=1, help="ready_stages of the walks")
    ap.add_argument("--segments", type=int, default=0, help="seq_segments (0: chosen from the shape)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="cuda", help="cpu: the interpreter (TRITON_INTERPRET=1)")
    args = ap.parse_args()

    import kernels.gdn as K
    import kernels.gdn.state as state
    from kernels.gdn.config import TUNING_FP32, tuned

    dt = getattr(torch, args.dtype)
    K.TUNING.update(walk_operands=1, ready_stages=args.stages, seq_segments=args.segments)
    TUNING_FP32["ready_stages"] = args.stages

    def stages(ready: bool, dtype: torch.dtype, device: torch.device) -> int:
        return args.stages if ready else int(tuned("state_stages", dtype))

    state.walk_stages = stages  # the refusal lifted for this process only
    torch.manual_seed(0)
    B, T, H, D = 1, args.seq_len, 32, 128
    dev = args.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    q = torch.randn(B, T, H, D, device=dev, dtype=dt)
    k = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, H, D, device=dev, dtype=dt)
    g = F.logsigmoid(torch.randn(B, T, H, device=dev) + 2.0)
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev)).to(dt)
    h0 = torch.randn(B, H, D, D, device=dev) * 0.1
    do = torch.randn_like(v) / v.numel()
    dht = torch.randn_like(h0) / h0.numel()

    steps = {}
    gamma = K.gate_cumsum(g)
    w, u, _ = K.intra_solve(k, v, beta, gamma, H, store_t=True)
    sync()

    def forward():
        steps["maps"] = K.state_forward(k, w, u, gamma, H, h0, store_states=True, store_vn=True,
                                        store_final=True, keep_maps=True)[3]  # fmt: skip

    def backward():
        K.state_backward(q, k, w, do, gamma, dht, D**-0.5, want_dh0=True, maps=steps["maps"])

    print(f"T={T} {args.dtype} ready_stages={args.stages} seq_segments={args.segments}", flush=True)
    for name, fn in (("state_forward", forward), ("state_backward", backward)):
        try:
            fn()
            sync()
        except RuntimeError as exc:
            print(f"{name}: FAILED {str(exc)[:200]}", flush=True)
            return 1
        print(f"{name}: ran", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
