"""Drive one suite on one device without the service (device machines lack its packages): print
a table, write JSON.

    python benchmarks/run_suite.py [--suite gdn-op] --preset full --device cuda --out gdn_op.json \
        [--set eager_repeat=5] [--only T16384_stateful]
    python benchmarks/run_suite.py --suite cp-layer --preset gate --device cuda \
        --set 'candidates=["p2p_emulated+flashqla"]'

Builds a one-rank `RankContext`, runs every case of the preset (or those whose name contains an
`--only` string) and writes all raw samples plus per-case medians (`workers.stats`, as the service
computes them: worst rank per idx, statistics of the finite values). A case that raises is
recorded with its error and the run goes on; a case the suite calls not applicable is recorded
with its reason.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.context import RankContext
from workers.registry import get_suite
from workers.stats import summarise_samples
from workers.suite import Suite

COLUMNS = [
    ("fwd_ms", "fwd"), ("fwd_bwd_ms", "f+b"), ("ratio_to_baseline", "/base"), ("tflops", "TF/s"),
    ("peak_bytes", "GiB"), ("peak_ratio_to_baseline", "mem/base"),
]


def _direction(suite: Suite, metric: str) -> str:
    """The metric's direction as the suite declares it; lower-is-better for an undeclared one."""
    try:
        return suite.metric(metric).direction
    except KeyError:
        return "lower"


def _parse_set(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="gdn-op")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="gdn_op.json")
    ap.add_argument("--set", action="append", default=[], help="parameter override key=value")
    ap.add_argument("--only", action="append", default=[], help="run cases whose name contains this")
    ap.add_argument("--tuning", default=None, help="JSON file of kernels.gdn.KernelConfig overrides")
    args = ap.parse_args()


    tuning = None
    if args.tuning and Path(args.tuning).is_file():
        import kernels.gdn as kernels_gdn

        tuning = json.loads(Path(args.tuning).read_text())
        kernels_gdn.override_for_run(**tuning)  # for every call of this run

    from gdn import device as devices

    suite = get_suite(args.suite)
    params = suite.resolve_params(args.preset, _parse_set(args.set))
    cases = [c for c in suite.cases(params) if not args.only or any(s in c.name for s in args.only)]
    dev = devices.get_device(args.device)
    ctx = RankContext(rank=0, world_size=1, device=dev, device_kind=args.device)
    info = devices.device_info(dev)
    from workers.provenance import backend_provenance

    info["backends"] = [backend_provenance(b) for b in suite.backends(params)]
    result: dict[str, object] = {"suite": args.suite, "preset": args.preset, "params": params.model_dump(),
                                 "info": info, "command": " ".join(sys.argv), "tuning": tuning,
                                 "cases": {}}
    rows = []
    for case in cases:
        t0 = time.time()
        samples, error = [], None
        reason = suite.why_not_here(case, 1)
        if reason is not None:
            result["cases"][case.name] = {"params": dict(case.params), "not_applicable": reason}  # type: ignore[index]
            print(f"[  n/a ] {case.name}: {reason}", flush=True)
            continue
        try:
            samples = list(suite.run(ctx, case))
        except Exception as exc:  # record and go on
            error = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        by_metric: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
        for s in samples:
            by_metric[s.metric].append((s.rank, s.idx, s.value))
        st = {m: summarise_samples(rows, _direction(suite, m)) for m, rows in by_metric.items()}
        med = {m: x.median for m, x in st.items()}
        worst = {m: x.worst for m, x in st.items() if m.endswith("_rel_l2")}
        result["cases"][case.name] = {  # type: ignore[index]
            "params": dict(case.params), "error": error, "seconds": time.time() - t0,
            "samples": [[s.metric, s.idx, s.value] for s in samples], "median": med, "worst_rel_l2": worst,
        }
        rows.append((case.name, med, worst, error))
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
        print(f"[{time.time() - t0:6.1f}s] {case.name} {'ERROR ' + error if error else ''}", flush=True)
        devices.empty_cache(dev)

    print(f"\n{info}")
    print("case".ljust(44) + "".join(h.rjust(9) for _, h in COLUMNS) + "  worst rel_l2")
    for name, med, worst, error in rows:
        cells = []
        for key, _ in COLUMNS:
            v = med.get(key)
            if v is not None and key.endswith("_bytes"):
                v = v / 2**30
            cells.append(f"{v:9.3f}" if v is not None else " " * 8 + "-")
        acc = max(worst.values(), default=float("nan"))
        print(name.ljust(44) + "".join(cells) + f"  {acc:.2e}" + (" ERROR" if error else ""))
    return 1 if any(r[3] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
