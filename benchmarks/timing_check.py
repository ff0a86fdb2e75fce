"""Check the gdn-op suite's timing against `triton.testing.do_bench`: per length and backend, the
suite's median fwd+bwd beside do_bench's of the backend's own call on the same inputs.

    python benchmarks/timing_check.py --backends triton,fla,flashqla --seq-lens 16384,65536 \
        --out timing.json [--qk-heads 32] [--v-heads 32] [--tolerance 0.10]

B = 1, stateful, D = 128, bf16: the inputs of the gdn-op suite and of benchmarks/bench_gdn_peers.py
(the same seed, so the same tensors). Per (T, backend):
- suite: the median of the `fwd_bwd_ms` samples of the gdn-op case itself (the suite's own
  `run`, accuracy off, the backend its own baseline), the number a job stores and judges;
- do_bench: `triton.testing.do_bench` of bench_gdn_peers' call of the backend (FLA's and
  FlashQLA's own functions; ours through `gdn.gated_delta_rule`) with its gradients dropped;
- suite call: do_bench of the suite's timed fwd+bwd call (`timed_calls`), which tells the
  suite's call apart from its timing method when the two differ;
- ratio suite / do_bench, PASS when within the tolerance.
A backend that cannot run here (not installed, no GPU) is listed with its reason. Rows already
in `--out` are kept and a row of the same (T, backend) replaced, so one process per backend (each
with its own PYTHONPATH, benchmarks/kernel_session.sh's `timing` step) builds one table.
`--compile-only` runs each call once untimed, so that compiles can fill the on-disk caches of
all backends at once, in parallel, before each is timed alone. On a CPU (`--device cpu`, for the
tests) a host clock stands in for do_bench. Exit code 1 when a row fails or errors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEER_NAMES = {"triton": "ours", "fla": "fla", "flashqla": "flashqla", "eager": "eager"}


def suite_median(backend: str, T: int, args: argparse.Namespace) -> float:
    """The median fwd+bwd of the gdn-op case of (T, backend) as the suite times it."""
    from gdn import device as devices
    from workers.context import RankContext
    from workers.registry import get_suite

    suite = get_suite("gdn-op")
    warmup, repeat = args.warmup, args.repeat
    params = suite.resolve_params("gate", {
        "seq_lens": (T,), "modes": ("stateful",), "qk_heads": (args.qk_heads,), "v_heads": args.v_heads,
        "batch": 1, "head_dim": args.head_dim, "dtype": args.dtype, "backends": (backend,),
        "baseline": backend, "timed_backends": None, "warmup": warmup, "repeat": repeat,
        "eager_warmup": warmup, "eager_repeat": repeat, "accuracy_max_seq_len": 0,
    })
    (case,) = suite.cases(params)
    dev = devices.get_device(args.device)
    ctx = RankContext(rank=0, world_size=1, device=dev, device_kind=args.device)
    times = [s.value for s in suite.run(ctx, case) if s.metric == "fwd_bwd_ms"]
    if len(times) != repeat:
        raise RuntimeError(f"the suite gave {len(times)} fwd_bwd_ms samples, expected {repeat}")
    devices.empty_cache(dev)
    return statistics.median(times)


def host_bench(fn: Callable[[], object], grads: Sequence[Any], warmup_ms: float, rep_ms: float) -> float:
    """do_bench's method with a host clock (a CPU has no device events): the median of timed calls
    after untimed ones filling `warmup_ms`, gradients dropped before each call."""
    def once() -> float:
        for t in grads:
            t.grad = None
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    first = once()
    for _ in range(max(1, int(warmup_ms / max(first, 1e-3)))):
        once()
    return statistics.median(once() for _ in range(max(5, int(rep_ms / max(first, 1e-3)))))


def bench(
    fn: Callable[[], object], grads: Sequence[Any], device: str, warmup_ms: float, rep_ms: float
) -> float:
    if device == "cpu":
        return host_bench(fn, grads, warmup_ms, rep_ms)
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=list(grads), return_mode="median"))


def bench_medians(backend: str, T: int, args: argparse.Namespace) -> tuple[float, float]:
    """(do_bench of bench_gdn_peers' call, do_bench of the suite's timed call), same inputs."""
    import torch

    import benchmarks.bench_gdn_peers as peers
    from workers.suites.gdn_op.run import timed_calls

    x = peers.make_inputs(T, args.qk_heads, 1000, torch.device(args.device))
    dt = getattr(torch, args.dtype)
    x = peers.leaves({k: t.to(dt) if t.dtype == torch.bfloat16 else t for k, t in x.items()})
    grads = [x[n] for n in peers.LEAVES]
    call = peers.caller(PEER_NAMES[backend])
    own = bench(lambda: peers.fwd_bwd(call, x), grads, args.device, args.warmup_ms, args.rep_ms)
    _, fwd_bwd, _ = timed_calls(backend, {**x, "cu": None}, final=True)
    suite_call = bench(fwd_bwd, grads, args.device, args.warmup_ms, args.rep_ms)
    return own, suite_call


def check_row(backend: str, T: int, args: argparse.Namespace) -> dict[str, Any]:
    """One (T, backend) row: the three medians, their ratio and whether it holds, or why not."""
    import torch

    from gdn import GDNShape, get_backend

    row: dict[str, Any] = {"T": T, "backend": backend}
    shape = GDNShape(1, T, args.qk_heads, args.v_heads, args.head_dim, args.head_dim)
    try:
        dtype, device = getattr(torch, args.dtype), torch.device(args.device)
        reason = get_backend(backend).unsupported(shape, dtype, device)
    except Exception as exc:  # an unknown name: its own row, the others still run
        reason = f"{type(exc).__name__}: {exc}"
    if reason is not None:
        row["skipped"] = reason
        return row
    t0 = time.time()
    try:
        row["suite_ms"] = suite_median(backend, T, args)
        row["do_bench_ms"], row["suite_call_ms"] = bench_medians(backend, T, args)
    except Exception as exc:  # recorded, and the next row runs
        traceback.print_exc()
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return row
    finally:
        row["wall_s"] = round(time.time() - t0, 1)
    row["ratio"] = row["suite_ms"] / row["do_bench_ms"]
    row["pass"] = abs(row["ratio"] - 1.0) <= args.tolerance
    return row


def compile_only(backend: str, T: int, args: argparse.Namespace) -> str:
    """One fwd+bwd of the backend's own call and of the suite's at T, nothing timed: fills the
    on-disk compile caches (Triton's, TileLang's) so that a later timing process starts warm.
    Returns what happened, for the log."""
    import torch

    import benchmarks.bench_gdn_peers as peers
    from gdn import GDNShape, get_backend
    from gdn import device as devices
    from workers.suites.gdn_op.run import timed_calls

    shape = GDNShape(1, T, args.qk_heads, args.v_heads, args.head_dim, args.head_dim)
    reason = get_backend(backend).unsupported(shape, getattr(torch, args.dtype), torch.device(args.device))
    if reason is not None:
        return f"skipped: {reason}"
    t0 = time.time()
    x = peers.leaves(peers.make_inputs(T, args.qk_heads, 1000, torch.device(args.device)))
    peers.fwd_bwd(peers.caller(PEER_NAMES[backend]), x)
    timed_calls(backend, {**x, "cu": None}, final=True)[1]()
    devices.synchronize(args.device)
    return f"compiled in {time.time() - t0:.0f} s"


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`old` rows with those of `new` added, a row of the same (T, backend) replaced."""
    fresh = {(r["T"], r["backend"]) for r in new}
    return [r for r in old if (r["T"], r["backend"]) not in fresh] + list(new)


def verdict(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return "skipped"
    if "error" in row:
        return "ERROR"
    return "PASS" if row["pass"] else "FAIL"


def table(rows: Sequence[dict[str, Any]], tolerance: float) -> str:
    """T × backend: suite median, do_bench median, the suite's call under do_bench, ratio, verdict."""
    lines = [f"{'T':>6}  {'backend':<9} {'suite ms':>9} {'do_bench':>9} {'suite call':>10} {'ratio':>6}  "
             f"within {tolerance:.0%}"]
    order = {b: i for i, b in enumerate(PEER_NAMES)}

    def num(r: dict[str, Any], key: str, width: int, digits: int = 3) -> str:
        v = r.get(key)
        return f"{v:{width}.{digits}f}" if isinstance(v, float) else " " * (width - 1) + "-"

    for r in sorted(rows, key=lambda r: (r["T"], order.get(r["backend"], 99), r["backend"])):
        note = r.get("skipped") or r.get("error") or ""
        lines.append(f"{r['T']:>6}  {r['backend']:<9} {num(r, 'suite_ms', 9)} {num(r, 'do_bench_ms', 9)} "
                     f"{num(r, 'suite_call_ms', 10)} {num(r, 'ratio', 6, 2)}  {verdict(r)} {note}".rstrip())
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="triton,fla,flashqla", help="comma-separated backend names")
    ap.add_argument("--seq-lens", default="16384,65536")
    ap.add_argument("--qk-heads", type=int, default=32)
    ap.add_argument("--v-heads", type=int, default=32)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--warmup", type=int, default=5, help="the suite's warm-up calls")
    ap.add_argument("--repeat", type=int, default=20, help="the suite's repetitions")
    ap.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warm-up, ms")
    ap.add_argument("--rep-ms", type=float, default=200.0, help="do_bench repetition, ms")
    ap.add_argument("--tolerance", type=float, default=0.10, help="largest |suite / do_bench - 1| passing")
    ap.add_argument("--head-dim", type=int, default=128, help="D (a CPU test uses a small one)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="q/k/v/beta/dO dtype (a CPU has no fast bf16 products)")
    ap.add_argument("--out", required=True, type=Path, help="JSON file; its rows are kept and updated")
    ap.add_argument("--print", dest="print_only", action="store_true",
                    help="print the table of the rows in --out and exit (1 when one fails or errors)")
    ap.add_argument("--compile-only", action="store_true",
                    help="one untimed fwd+bwd per length (fills the compile caches); --out is not written")
    args = ap.parse_args(argv)
    args.backend_list = [b for b in args.backends.split(",") if b]
    args.lens = [int(t) for t in args.seq_lens.split(",") if t]
    if not args.backend_list or not args.lens:
        ap.error(f"--backends {args.backends!r} and --seq-lens {args.seq_lens!r} must name at least one each")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import benchmarks.bench_gdn_peers as peers

    if args.print_only:
        doc = json.loads(args.out.read_text()) if args.out.is_file() else {}
        rows = doc.get("rows", [])
        print(table(rows, doc.get("tolerance", args.tolerance)), flush=True)
        return 1 if not rows or any(verdict(r) in ("FAIL", "ERROR") for r in rows) else 0
    peers.HV, peers.DH = args.v_heads, args.head_dim
    if args.compile_only:
        for T in args.lens:
            for backend in args.backend_list:
                print(f"T={T} {backend}: {compile_only(backend, T, args)}", flush=True)
        return 0
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    doc.setdefault("rows", [])
    doc["tolerance"] = args.tolerance
    doc.setdefault("commands", []).append(" ".join(sys.argv))
    from gdn import device as devices
    from workers.provenance import backend_provenance

    doc["device"] = devices.device_info(args.device)
    for backend in args.backend_list:  # where each backend's code came from, in its own process
        doc.setdefault("backends", {})[backend] = backend_provenance(backend)
    for T in args.lens:
        for backend in args.backend_list:
            row = check_row(backend, T, args)
            doc["rows"] = merge(doc["rows"], [row])
            args.out.write_text(json.dumps(doc, indent=1))
            print(f"T={T} {backend}: {verdict(row)} {json.dumps(row)}", flush=True)
    print(table(doc["rows"], args.tolerance), flush=True)
    mine = [r for r in doc["rows"] if r["backend"] in args.backend_list and r["T"] in args.lens]
    return 1 if any(verdict(r) in ("FAIL", "ERROR") for r in mine) else 0


if __name__ == "__main__":
    raise SystemExit(main())
