"""Time each stage of the Triton GDN kernels and sweep their launch settings (one GPU).

    python benchmarks/profile_gdn_stages.py --seq-len 65536 --qk-heads 32 [--sweep] [--fla] [--set JSON]

Prints the median ms of every stage (`triton.testing.do_bench`), the whole fwd and fwd+bwd of
ours and, with --fla, of flash-linear-attention 0.6.0 on the same inputs. --sweep retimes each
stage under the alternatives in SWEEP (or only the --knobs named) and prints the best setting per
stage. --set applies `kernels.gdn.KernelConfig` field overrides to everything; the sweep overrides
one field more at a time. The state passes run with the segment count of `seq_segments` (0: chosen
from the shape); state_fwd / state_bwd alone are timed as the wiring calls them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (stage timed, knob, values). Knobs are tried one after another, each keeping the best so far
# only where it beats the value in force by more than ADOPT_MARGIN (a median's noise is not a
# setting); state_bv is shared by both sequential passes, so it is judged on state_fwd + state_bwd.
SWEEP: list[tuple[str, str, list[int | str]]] = [
    ("state_both", "seq_segments", [1, 2, 4, 8]),
    ("state_both", "state_bv", [16, 32, 64]),
    ("state_both", "state_warps", [2, 4, 8]),
    ("state_both", "state_stages", [1, 2, 3]),
    ("intra", "intra_warps", [1, 2, 4, 8]),
    ("intra", "intra_bk", [32, 64, 128]),
    ("intra", "f32_dot_wu", ["low", "tf32"]),
    ("intra", "intra_wu_bd", [128, 64]),
    ("intra", "intra_wu_warps", [4, 8]),
    ("intra", "f32_dot_inv", ["ieee", "tf32x3"]),
    ("output", "out_bv", [32, 64, 128]),
    ("output", "output_warps", [4, 8]),
    ("dvn_local", "dvl_warps", [4, 8]),
    ("bwd_dqk", "dqk_bv", [32, 64]),
    ("bwd_dqk", "dqk_bk", [64, 128]),
    ("bwd_dqk", "dqk_warps", [4, 8]),
    ("bwd_wy", "wy_warps", [4, 8]),
    ("bwd_wy", "wy_bd", [32, 64, 128]),
]
ADOPT_MARGIN = 0.01


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=65536)
    ap.add_argument("--qk-heads", type=int, default=32)
    ap.add_argument("--v-heads", type=int, default=32)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--fla", action="store_true")
    ap.add_argument("--knobs", default="", help="sweep only these config fields (comma-separated)")
    ap.add_argument("--write-tuning", default=None, help="write the best overrides found as JSON here")
    ap.add_argument("--set", default="", help="config overrides (JSON) applied to everything")
    args = ap.parse_args()
    unknown = sorted({x for x in args.knobs.split(",") if x} - {knob for _, knob, _ in SWEEP})
    if unknown:  # a sweep that times nothing would also write no --write-tuning file
        ap.error(f"--knobs {unknown} are not swept; expected some of {[knob for _, knob, _ in SWEEP]}")

    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    import kernels.gdn as K

    best: dict[str, object] = json.loads(args.set) if args.set else {}
    K.override_for_run(**best)  # for the whole run; the sweep nests its own inside
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
    s, vn, _, maps = K.state_forward(
        k, w, u, gamma, Hv, h0, store_states=True, store_vn=True, store_final=True, keep_maps=True
    )
    ds, dvn, _ = K.state_backward(q, k, w, do, gamma, dht, scale, want_dh0=True, maps=maps)
    fresh: dict[str, object] = {}

    def state_both() -> None:
        """Both passes as the autograd wiring runs them (segment maps from the forward)."""
        _, _, _, mp = K.state_forward(k, w, u, gamma, Hv, h0, store_states=True, store_vn=True,
                                      store_final=True, keep_maps=True)
        K.state_backward(q, k, w, do, gamma, dht, scale, want_dh0=True, maps=mp)

    def wy() -> None:
        """bwd_wy with a dWk of the current dtype setting (dw_low)."""
        dw_low = K.kernel_config(bf).dw_low
        if fresh.get("dw_low") != dw_low:
            fresh["dw_low"] = dw_low
            fresh["args"] = K.bwd_dqk(q, k, Hv, gamma, s, ds, vn, dvn, do, scale)
        _, dkp_, dw_, dgam_ = fresh["args"]
        # grouped heads: bwd_wy carries dk through dkp_ in place (the values drift, the work does not)
        K.bwd_wy(k, v, beta, g.dtype, gamma, tm, dw_, dvn, dkp_, dgam_)

    stages = {
        "gate_cumsum": lambda: K.gate_cumsum(g),
        "intra": lambda: K.intra_solve(k, v, beta, gamma, Hv, store_t=True),
        "state_fwd": lambda: K.state_forward(k, w, u, gamma, Hv, h0, store_states=True, store_vn=True,
                                             store_final=True),
        "output": lambda: K.output(q, k, vn, s, gamma, Hv, scale, bf),
        "dvn_local": lambda: K.dvn_local(q, k, do, gamma, scale),
        "state_bwd": lambda: K.state_backward(q, k, w, do, gamma, dht, scale, want_dh0=True, maps=maps),
        "bwd_dqk": lambda: K.bwd_dqk(q, k, Hv, gamma, s, ds, vn, dvn, do, scale),
        "bwd_wy": wy,
        "summary_S_ext": lambda: K.state_summary(k, v, g, beta),
    }

    def bench(fn) -> float:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")

    from gdn import device as devices

    print(f"T={T} Hqk={Hq} Hv={Hv} {devices.device_info('cuda')['device_name']}")
    for name, fn in stages.items():
        print(f"  {name:14s} {bench(fn):8.3f} ms")

    def ours_fb():
        xs = [t.detach().requires_grad_() for t in (q, k, v, g, beta, h0)]
        o, ht = K.gated_delta_rule_triton(*xs[:5], initial_state=xs[5], output_final_state=True)
        torch.autograd.backward([o, ht], [do, dht])

    def ours_f():  # inputs without requires_grad: the forward keeps nothing for a backward
        K.gated_delta_rule_triton(q, k, v, g, beta, initial_state=h0, output_final_state=True)

    def ours_f_train():  # a training forward: keeps what the backward reads
        xs = [t.detach().requires_grad_() for t in (q, k, v, g, beta, h0)]
        K.gated_delta_rule_triton(*xs[:5], initial_state=xs[5], output_final_state=True)

    print(f"  ours fwd       {bench(ours_f):8.3f} ms (no autograd)")
    print(f"  ours fwd train {bench(ours_f_train):8.3f} ms")
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
        stages["state_both"] = state_both
        only = {x for x in args.knobs.split(",") if x}
        for stage, knob, values in SWEEP:
            if only and knob not in only:
                continue
            res = []
            for val in values:
                try:
                    with K.config_overrides(**(best | {knob: val})):
                        res.append((bench(stages[stage]), val))
                except Exception as exc:  # e.g. out of shared memory
                    print(f"  {stage} {knob}={val}: {type(exc).__name__}: {str(exc)[:120]}")
            current = best.get(knob, getattr(K.kernel_config(bf), knob))
            now = [t for t, v in res if v == current]
            if res and (not now or min(res)[0] < now[0] * (1 - ADOPT_MARGIN)):
                best[knob] = min(res)[1]
            print(f"  sweep {stage:10s} {knob:13s} " + "  ".join(f"{v}:{t:.3f}" for t, v in res)
                  + f"  -> {best.get(knob, current)}", flush=True)
            if args.write_tuning:  # after every knob: a sweep cut at its limit keeps what it found
                Path(args.write_tuning).write_text(json.dumps(best))
        with K.config_overrides(**best):
            print(f"  tuned fwd+bwd  {bench(ours_fb):8.3f} ms  {best}")


if __name__ == "__main__":
    main()
