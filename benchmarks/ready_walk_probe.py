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
    from benchmarks.bench_gdn_peers import HV, make_inputs
    from kernels.gdn.config import tuned

    K.TUNING.update(walk_operands=1, seq_segments=args.segments)

    def stages(ready: bool, dtype: torch.dtype, device: torch.device) -> int:
        return args.stages if ready else int(tuned("state_stages", dtype))

    state.walk_stages = stages  # the refusal lifted for this process only
    dt = getattr(torch, args.dtype)
    x = make_inputs(args.seq_len, HV, 0, args.device)  # bf16 leaves, fp32 g and states
    q, k, v, beta, do = (x[n].to(dt) for n in ("q", "k", "v", "beta", "do"))
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    gamma = K.gate_cumsum(x["g"])
    w, u, _ = K.intra_solve(k, v, beta, gamma, HV, store_t=True)
    sync()
    setting = f"ready_stages={args.stages} seq_segments={args.segments}"
    print(f"T={args.seq_len} {args.dtype} {setting}", flush=True)
    stage = "state_forward"
    try:
        maps = K.state_forward(k, w, u, gamma, HV, x["h0"], store_states=True, store_vn=True,
                               store_final=True, keep_maps=True)[3]  # fmt: skip
        sync()
        print(f"{stage}: ran", flush=True)
        stage = "state_backward"
        K.state_backward(q, k, w, do, gamma, x["dht"], q.shape[-1] ** -0.5, want_dh0=True, maps=maps)
        sync()
        print(f"{stage}: ran", flush=True)
    except RuntimeError as exc:
        print(f"{stage}: FAILED {str(exc)[:200]}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
