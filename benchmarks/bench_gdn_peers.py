"""Time one GDN backend (ours, FLA or FlashQLA) on the gdn-op production shapes; one process each.

    python benchmarks/bench_gdn_peers.py --backend ours --seq-lens 8192,65536 --qk-heads 32,16 \
        --out ours.json [--variant NAME=JSON ...] [--profile 32768] [--accuracy-seeds 0,1,2] \
        [--packed 1,63,64,65,1000,3000,4096,8095 ...]

B = 1, Hv = 32, D = 128, bf16 inputs, stateful (fp32 h0 and final state, random dO and dHT), the
inputs of the gdn-op suite. Per shape: forward and forward+backward medians
(`triton.testing.do_bench`), the incremental peak of allocated memory over one forward+backward,
and, per accuracy seed, the relative L2 error of o, ht and every gradient against the fp32 eager
chunked backend (tf32 off). `--variant` runs ours again under config overrides (one JSON dict
of `kernels.gdn.KernelConfig` fields each). `--profile T` records torch.profiler GPU time per
kernel over 5 forward+backward steps at T (Hqk = Hv). `--packed L1,L2,...` adds a packed batch
of those sequence lengths (`cu_seqlens`, one h0 and final state per sequence, the gdn-op suite's
packed cases). `--against-default` compares every variant's o, ht and gradients with the default
settings' on the same inputs (rel-L2 and bit equality); `--variant-accuracy-seeds` sets the
accuracy seeds of the variants apart from the default's. Without a GPU nothing runs, unless
`--dry-run`: the same steps on the CPU (under TRITON_INTERPRET=1, fp16 or fp32 inputs, small
shapes), timed by the wall clock, no peak, to show the command works before a device call. FLA is timed with
FLA_FLASH_QLA=0 (FLA 0.6.0 otherwise dispatches to FlashQLA when that is importable) and with its
Triton >= 3.7.1 flag set (it refuses its gated backward on Hopper before that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HV, DH = 32, 128
TENSORS = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")


DTYPE = "bfloat16"  # the inputs' dtype (--dtype)


def make_inputs(
    T: int, hqk: int, seed: int, device: Any, lens: list[int] | None = None, *, hv: int | None = None,
    dtype: str | None = None,
) -> dict[str, Any]:
    """The gdn-op suite's inputs: dO and dHT divided by their element count; with `lens` (a
    packed batch, sum(lens) = T) one h0 / dHT per sequence and the offsets `cu`. `hv` and
    `dtype` (a torch dtype's name) default to the run's (--v-heads, --dtype)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    bf = getattr(torch, dtype or DTYPE)
    hv = hv or HV
    n = len(lens) if lens else 1
    x = {
        "q": rnd(1, T, hqk, DH).to(bf),
        "k": F.normalize(rnd(1, T, hqk, DH), dim=-1).to(bf),
        "v": rnd(1, T, hv, DH).to(bf),
        "g": F.logsigmoid(rnd(1, T, hv) + 2.0),
        "beta": torch.sigmoid(rnd(1, T, hv)).to(bf),
        "h0": rnd(n, hv, DH, DH) * 0.1,
    }
    do = rnd(1, T, hv, DH)
    x["do"] = (do / do.numel()).to(bf)
    dht = rnd(n, hv, DH, DH)
    x["dht"] = dht / dht.numel()
    if lens:
        x["cu"] = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return {name: t.to(device) for name, t in x.items()}


LEAVES = ("q", "k", "v", "g", "beta", "h0")


def leaves(x: dict[str, Any], dtype: Any = None) -> dict[str, Any]:
    out = dict(x)
    for n in LEAVES:
        t = x[n].detach().clone()
        out[n] = (t.to(dtype) if dtype is not None else t).requires_grad_(True)
    return out


def caller(backend: str) -> Any:
    if backend == "fla":
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        fla_chunk_o.TRITON_ABOVE_3_7_1 = True

        def call(x: dict[str, Any]) -> tuple[Any, Any]:
            return chunk_gated_delta_rule(
                x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"], output_final_state=True,
                cu_seqlens=x.get("cu"),
            )

        return call
    if backend == "flashqla":
        from flash_qla import chunk_gated_delta_rule as qla

        def call(x: dict[str, Any]) -> tuple[Any, Any]:
            return qla(
                x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"], output_final_state=True,
                cu_seqlens=x.get("cu"),
            )

        return call
    from gdn import gated_delta_rule

    def call(x: dict[str, Any]) -> tuple[Any, Any]:
        return gated_delta_rule(
            x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"], output_final_state=True,
            cu_seqlens=x.get("cu"), backend="triton" if backend == "ours" else backend,
        )

    return call


def fwd_bwd(call: Any, x: dict[str, Any]) -> dict[str, Any]:
    import torch

    o, ht = call(x)
    torch.autograd.backward([o, ht], [x["do"].to(o.dtype), x["dht"].to(ht.dtype)])
    res = {"o": o.detach(), "ht": ht.detach()}
    for n in LEAVES:
        res["dbeta" if n == "beta" else f"d{n}"] = x[n].grad
    return res


def reference(x: dict[str, Any]) -> dict[str, Any]:
    import torch

    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        r = leaves(x, torch.float32)
        r["do"] = x["do"].float()
        return fwd_bwd(caller("eager"), r)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def rel_l2(a: Any, b: Any) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def wall_ms(fn: Any, warmup: int = 0, rep: int = 0, grad_to_none: list[Any] | None = None,
            return_mode: str = "") -> float:
    """The dry run's stand-in for do_bench (same arguments): one call's wall-clock time (the CPU
    has no events)."""
    for t in grad_to_none or []:
        t.grad = None
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def compare(got: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """rel-L2 of each tensor against another run's, and the names of those that are bit-equal."""
    errs = {n: rel_l2(got[n].to(want[n].device), want[n]) for n in TENSORS}
    return {"rel_l2": errs, "worst_rel_l2": max(errs.values()),
            "equal": sorted(n for n in TENSORS if torch_equal(got[n], want[n]))}


def torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a.to(b.device), b))


def measure(
    call: Any, T: int, hqk: int, seeds: list[int], dev: Any, warm: int, rep: int, repro: bool = False,
    lens: list[int] | None = None, default: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Times, peak and accuracy of one shape; `default`: the default settings' results on the
    inputs of seed 1, which this run's are compared with."""
    import torch

    cuda = dev.type == "cuda"
    if cuda:
        from triton.testing import do_bench
    else:
        do_bench = wall_ms

    out: dict[str, Any] = {"T": T, "hqk": hqk, **({"packed": lens} if lens else {})}
    x = leaves(make_inputs(T, hqk, 1000, dev, lens))
    grads = [x[n] for n in LEAVES]

    def f() -> None:
        call(x)

    def fb() -> None:
        fwd_bwd(call, x)

    out["fwd_ms"] = do_bench(f, warmup=warm, rep=rep, return_mode="median")
    out["fwd_bwd_ms"] = do_bench(fb, warmup=warm, rep=rep, grad_to_none=grads, return_mode="median")
    out["fwd_bwd_ms_again"] = do_bench(fb, warmup=warm, rep=rep, grad_to_none=grads, return_mode="median")
    for t in grads:
        t.grad = None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fb()
        torch.cuda.synchronize()
        out["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    x = grads = None  # the timed closures are done
    if cuda:
        torch.cuda.empty_cache()
    errs: dict[str, float] = defaultdict(float)
    for seed in seeds:
        xs = make_inputs(T, hqk, seed, dev, lens)
        ref = reference(xs)
        got = fwd_bwd(call, leaves(xs))
        for n in TENSORS:
            e = rel_l2(got[n], ref[n])
            errs[n] = max(errs[n], e) if e == e else float("nan")
        del ref, got, xs
        if cuda:
            torch.cuda.empty_cache()
    if repro or default is not None:
        xs = make_inputs(T, hqk, 1, dev, lens)
        a = fwd_bwd(call, leaves(xs))
        if repro:
            b = fwd_bwd(call, leaves(xs))
            out["differ_between_runs"] = sorted(n for n in TENSORS if not torch.equal(a[n], b[n]))
            del b
        if default is not None:
            out["vs_default"] = compare(a, default)
        del a, xs
    if seeds:
        out["rel_l2"] = dict(errs)
        out["worst_rel_l2"] = max(errs.values())
    return out


def profile(call: Any, T: int, dev: Any, steps: int = 5) -> list[tuple[str, float, int]]:
    """Mean GPU ms per kernel over `steps` forward+backward steps (calls per step beside it)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    x = leaves(make_inputs(T, HV, 1000, dev))
    for _ in range(2):
        fwd_bwd(call, x)
        for n in LEAVES:
            x[n].grad = None
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fwd_bwd(call, x)
            for n in LEAVES:
                x[n].grad = None
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        dt = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if dt > 0:
            rows.append((ev.key[:80], dt / 1e3 / steps, ev.count // steps))
    return sorted(rows, key=lambda r: -r[1])


def main() -> int:
    global HV, DTYPE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("ours", "fla", "flashqla"), required=True)
    ap.add_argument("--seq-lens", default="8192,16384,32768,65536")
    ap.add_argument("--qk-heads", default="32,16")
    ap.add_argument("--v-heads", type=int, default=HV)
    ap.add_argument("--accuracy-seeds", default="0")
    ap.add_argument("--variant-accuracy-seeds", default=None,
                    help="accuracy seeds of the variants (default: --accuracy-seeds)")
    ap.add_argument("--against-default", action="store_true",
                    help="compare each variant's results with the default settings' on the same inputs")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--dry-run", action="store_true",
                    help="without a GPU: run every step on the CPU (TRITON_INTERPRET=1; not bf16)")
    ap.add_argument("--set", default="", help="KernelConfig overrides (JSON) of ours' default settings")
    ap.add_argument("--variant", action="append", default=[], help="NAME=JSON of config overrides (ours)")
    ap.add_argument("--variant-seq-lens", default=None, help="lengths for the variants (default --seq-lens)")
    ap.add_argument("--profile", type=int, default=0, help="T of a per-kernel profile (0: none)")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=int, default=200, help="do_bench repetition, ms")
    ap.add_argument("--repro", action="store_true", help="also compare two identical fwd+bwd runs bitwise")
    ap.add_argument("--packed", action="append", default=[],
                    help="L1,L2,... sequence lengths of a packed batch (cu_seqlens), after the dense lengths")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import triton

    HV, DTYPE = args.v_heads, args.dtype
    if args.dry_run:
        if args.backend != "ours" or os.environ.get("TRITON_INTERPRET") != "1" or DTYPE == "bfloat16":
            print("--dry-run runs ours under TRITON_INTERPRET=1 with --dtype float16 or float32")
            return 2
        dev = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("no GPU: nothing measured")
        return 0
    else:
        dev = torch.device("cuda")
    if args.backend == "fla":
        os.environ["FLA_FLASH_QLA"] = "0"
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "none (dry run)"
    versions = {"torch": torch.__version__, "triton": triton.__version__, "gpu": gpu, "dtype": DTYPE}
    for mod in ("fla", "flash_qla", "tilelang"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as exc:  # recorded, not hidden: the version field says why it is missing
            versions[mod] = f"not importable: {type(exc).__name__}"
    lens = [int(t) for t in args.seq_lens.split(",") if t]
    heads = [int(h) for h in args.qk_heads.split(",") if h]
    seeds = [int(s) for s in args.accuracy_seeds.split(",") if s]
    vseeds = seeds if args.variant_accuracy_seeds is None else [
        int(s) for s in args.variant_accuracy_seeds.split(",") if s]
    packs = [[int(n) for n in item.split(",")] for item in args.packed]
    result: dict[str, Any] = {"backend": args.backend, "versions": versions, "command": " ".join(sys.argv),
                              "runs": []}
    variants: list[tuple[str, dict[str, Any]]] = [("default", {})]
    for item in args.variant:
        name, _, raw = item.partition("=")
        variants.append((name, json.loads(raw)))
    call = caller(args.backend)
    base = json.loads(args.set or "{}")

    def settings(over: dict[str, Any]) -> Any:
        """ours under the config fields of --set and then the variant's; the peers as they are."""
        if args.backend != "ours":
            return contextlib.nullcontext()
        from kernels.gdn import config_overrides

        return config_overrides(**(base | over))

    defaults: dict[tuple, dict[str, Any]] = {}  # shape -> the default settings' results (CPU)

    def default_results(T: int, hqk: int, ls: list[int] | None) -> dict[str, Any]:
        key = (T, hqk, tuple(ls or ()))
        if key not in defaults:
            with settings({}):
                got = fwd_bwd(call, leaves(make_inputs(T, hqk, 1, dev, ls)))
            defaults[key] = {n: got[n].detach().cpu() for n in TENSORS}
        return defaults[key]

    print(json.dumps(versions), flush=True)
    for vname, over in variants:
        vlens = lens if vname == "default" or not args.variant_seq_lens else [
            int(t) for t in args.variant_seq_lens.split(",")]
        shapes = [(T, None) for T in vlens] + [(sum(ls), ls) for ls in packs]
        for T, ls in shapes:
            for hqk in heads:
                t0 = time.time()
                try:
                    default = None
                    if args.against_default and vname != "default":
                        default = default_results(T, hqk, ls)
                    with settings(over):
                        r = measure(call, T, hqk, seeds if vname == "default" else vseeds, dev, args.warmup,
                                    args.rep, args.repro, ls, default)
                except Exception as exc:  # one failing shape is recorded and the run goes on
                    r = {"T": T, "hqk": hqk, "error": f"{type(exc).__name__}: {exc}"[:500]}
                r["variant"] = vname
                r["wall_s"] = round(time.time() - t0, 1)
                result["runs"].append(r)
                Path(args.out).write_text(json.dumps(result, indent=1))
                err = r.get("worst_rel_l2")
                tag = f"T={T:6d}" if ls is None else f"packed{len(ls)}_T{T}"
                peak = f"{r['peak_mib']:7.0f}MiB" if "peak_mib" in r else "untracked"
                print(f"{args.backend:8s} {vname:12s} {tag} hqk={hqk:2d} fwd={r.get('fwd_ms', 0):7.3f} "
                      f"fb={r.get('fwd_bwd_ms', 0):7.3f}/{r.get('fwd_bwd_ms_again', 0):7.3f} "
                      f"peak={peak} "
                      f"worst={err if err is None else f'{err:.2e}'} "
                      f"differ={r.get('differ_between_runs', '-')} "
                      f"vs_default={r['vs_default']['worst_rel_l2'] if 'vs_default' in r else '-'} "
                      f"{r.get('error', '')}",
                      flush=True)
    if args.profile:
        with settings({}):
            rows = profile(call, args.profile, dev)
        result["profile"] = {"T": args.profile, "kernels": rows}
        Path(args.out).write_text(json.dumps(result, indent=1))
        total = sum(r[1] for r in rows)
        print(f"profile T={args.profile} {args.backend}: {total:.2f} ms GPU per fwd+bwd")
        for name, ms, n in rows[:14]:
            print(f"  {ms:7.3f} ms  x{n:<3d} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
