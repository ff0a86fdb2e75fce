"""Time each stage of the Triton GDN kernels and sweep their launch settings (one GPU).

    python benchmarks/profile_gdn_stages.py --seq-len 65536 --qk-heads 32 [--sweep] [--fla]

Prints the median ms of every stage (`triton.testing.do_bench`), the whole fwd and fwd+bwd of
ours and, with --fla, of flash-linear-attention 0.6.0 on the same inputs. --sweep retimes each
stage under the alternatives in SWEEP and prints the best setting per stage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SWEEP: dict[str, list[tuple[str, list[int]]]] = {
    "intra": [("intra_warps", [2, 4, 8])],
    "state_fwd": [("state_bv", [16, 32, 64]), ("state_warps", [2, 4, 8]), ("state_stages", [1, 2, 3])],
    "output": [("output_warps", [4, 8]), ("out_bv", [64, 128])],
    "state_bwd": [("state_bv", [16, 32, 64]), ("state_warps", [2, 4, 8]), ("state_stages", [1, 2, 3]),
                  ("dvl_warps", [4, 8])],
    "chunk_bwd": [("dqk_warps", [4, 8]), ("dqk_bv", [32, 64]), ("wy_warps", [4, 8]), ("wy_bd", [32, 64])],
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=65536)
    ap.add_argument("--qk-heads", type=int, default=32)
    ap.add_argument("--v-heads", type=int, default=32)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--fla", action="store_true")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    import kernels.gdn_chunk as K

    torch.manual_seed(0)
    B, T, Hq, Hv, D = 1, args.seq_len, args.qk_heads, args.v_heads, 128
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(B, T, Hq, D, device=dev, dtype=bf)
    k = F.normalize(torch.randn(B, T, Hq, D, device=dev), dim=-1).to(bf)
    v = torch.randn(B, T, Hv, D, device=dev, dtype=bf)
    g = F.logsigmoid(torch.randn(B, T, Hv, device=dev) + 2.0)
    beta = torch.sigmoid(torch.randn(B, T, Hv, device=dev)).to(bf)
    h0 = torch.randn(B, Hv, D, D, device=dev) * 0.1
    do = torch.randn(B, T, Hv, D, device=dev, dtype=bf) / (B * T * Hv * D)
    dht = torch.randn(B, Hv, D, D, device=dev) / (B * Hv * D * D)
    scale = D**-0.5

    gamma = K.gate_cumsum(g)
    w, u, tm = K.intra_solve(k, v, beta, gamma, Hv, store_t=True)
    s, vn, _ = K.state_forward(k, w, u, gamma, Hv, h0, store_states=True, store_vn=True, store_final=True)
    ds, dvn, _ = K.state_backward(q, k, w, do, gamma, dht, scale, want_dh0=True)

    stages = {
        "gate_cumsum": lambda: K.gate_cumsum(g),
        "intra": lambda: K.intra_solve(k, v, beta, gamma, Hv, store_t=True),
        "state_fwd": lambda: K.state_forward(k, w, u, gamma, Hv, h0, store_states=True, store_vn=True,
                                             store_final=True),
        "output": lambda: K.output(q, k, vn, s, gamma, Hv, scale, bf),
        "state_bwd": lambda: K.state_backward(q, k, w, do, gamma, dht, scale, want_dh0=True),
        "chunk_bwd": lambda: K.chunk_backward(q, k, v, beta, g.dtype, gamma, tm, s, ds, vn, dvn, do, scale),
        "summary_S_ext": lambda: K.state_summary(k, v, g, beta),
    }  # fmt: skip

    def bench(fn) -> float:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")

    print(f"T={T} Hqk={Hq} Hv={Hv} {torch.cuda.get_device_name()}")
    for name, fn in stages.items():
        print(f"  {name:14s} {bench(fn):8.3f} ms")

    def ours_fb():
        xs = [t.detach().requires_grad_() for t in (q, k, v, g, beta, h0)]
        o, ht = K.gated_delta_rule_triton(*xs[:5], initial_state=xs[5], output_final_state=True)
        torch.autograd.backward([o, ht], [do, dht])

    def ours_f():
        K.gated_delta_rule_triton(q, k, v, g, beta, initial_state=h0, output_final_state=True)

    print(f"  ours fwd       {bench(ours_f):8.3f} ms")
    print(f"  ours fwd+bwd   {bench(ours_fb):8.3f} ms")
    if args.fla:
        import fla.ops.common.chunk_o as fco
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        fco.TRITON_ABOVE_3_7_1 = True

        def fla_fb():
            xs = [t.detach().requires_grad_() for t in (q, k, v, g, beta, h0)]
            o, ht = chunk_gated_delta_rule(*xs[:5], initial_state=xs[5], output_final_state=True)
            torch.autograd.backward([o, ht], [do, dht])

        print(f"  fla fwd+bwd    {bench(fla_fb):8.3f} ms")
    if args.sweep:
        base = dict(K.TUNING)
        for stage, knobs in SWEEP.items():
            for knob, values in knobs:
                res = []
                for val in values:
                    K.TUNING.update(base)
                    K.TUNING[knob] = val
                    try:
                        res.append((bench(stages[stage]), val))
                    except Exception as exc:  # e.g. out of shared memory
                        print(f"  {stage} {knob}={val}: {type(exc).__name__}: {str(exc)[:120]}")
                print(f"  sweep {stage:10s} {knob:13s} " + "  ".join(f"{v}:{t:.3f}" for t, v in res))
        K.TUNING.update(base)


if __name__ == "__main__":
    main()
