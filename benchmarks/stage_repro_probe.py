"""Which GDN stage stops repeating bit for bit? Runs one fwd+bwd of the Triton kernels twice on
the same inputs, records every stage's outputs as `kernels.gdn.function` calls them (in call
order, cloned at return) and names the first stage whose outputs differ between the runs, then
every differing tensor.

    python3 benchmarks/stage_repro_probe.py --packed 1,63,64,65,1000,3000,4096,8095 \
        --qk-heads 16 --v-heads 32 [--set JSON]

Dense with --seq-len instead of --packed. The gdn-op suite's stateful inputs (seed 0, as
`bench_gdn_peers.make_inputs` draws them), bf16 on a GPU; on a CPU (TRITON_INTERPRET=1) fp16 at
whatever small shape is given. Exits 0 when every
stage repeats, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.gdn.function as gdn_function
from benchmarks.bench_gdn_peers import LEAVES, leaves, make_inputs
from kernels.gdn import config_overrides, gated_delta_rule_triton, gated_delta_rule_triton_varlen

STAGES = ("gate_cumsum", "intra_solve", "state_forward", "output", "state_backward", "bwd_dqk", "bwd_wy")

Record = list[tuple[str, list[torch.Tensor | None]]]


def _tensors(out: object) -> list[torch.Tensor | None]:
    """The tensors a stage returned (nested tuples flattened), cloned; anything else as None."""
    if isinstance(out, torch.Tensor):
        return [out.detach().clone()]
    if isinstance(out, (tuple, list)):
        return [t for x in out for t in _tensors(x)]
    return [None]


@contextmanager
def recorded_stages(record: Record) -> Iterator[None]:
    """Every stage `kernels.gdn.function` calls appends (name, its outputs) to `record`."""
    originals = {name: getattr(gdn_function, name) for name in STAGES}

    def wrap(name: str, fn: Callable) -> Callable:
        def call(*args: object, **kwargs: object) -> object:
            out = fn(*args, **kwargs)
            record.append((name, _tensors(out)))
            return out
        return call

    for name, fn in originals.items():
        setattr(gdn_function, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(gdn_function, name, fn)


def run_once(x: dict[str, torch.Tensor]) -> Record:
    """One fwd+bwd of the inputs of `make_inputs` (packed when they have offsets `cu`); the
    stages' outputs, then the op's outputs and gradients as a last entry."""
    cu = x.get("cu")
    lv = leaves(x)
    args = [lv[n] for n in ("q", "k", "v", "g", "beta")]
    record: Record = []
    with recorded_stages(record):
        if cu is None:
            o, ht = gated_delta_rule_triton(*args, initial_state=lv["h0"], output_final_state=True)
        else:
            o, ht = gated_delta_rule_triton_varlen(*args, cu_seqlens=cu, initial_state=lv["h0"],
                                                   output_final_state=True)
        torch.autograd.backward([o, ht], [x["do"], x["dht"]])
    record.append(("outputs (o, ht, dq, dk, dv, dg, dbeta, dh0)",
                   [o.detach(), ht.detach(), *(lv[n].grad for n in LEAVES)]))
    return record


def compare(first: Record, second: Record) -> list[str]:
    """One line per stage call whose outputs differ: the call, which outputs, the largest
    difference."""
    if [n for n, _ in first] != [n for n, _ in second]:
        return [f"the runs called different stages: {[n for n, _ in first]} / {[n for n, _ in second]}"]
    lines = []
    for i, ((name, a), (_, b)) in enumerate(zip(first, second, strict=True)):
        pairs = enumerate(zip(a, b, strict=True))
        bad = [(j, float((x.double() - y.double()).abs().max())) for j, (x, y) in pairs
               if x is not None and not torch.equal(x, y)]
        if bad:
            lines.append(f"call {i} {name}: outputs " + ", ".join(f"#{j} (max {d:.2e})" for j, d in bad))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, default=0, help="one dense sequence of this many rows")
    ap.add_argument("--packed", default="", help="packed sequence lengths, comma-separated")
    ap.add_argument("--qk-heads", type=int, default=16)
    ap.add_argument("--v-heads", type=int, default=32)
    ap.add_argument("--set", default="", help="KernelConfig overrides (JSON)")
    args = ap.parse_args()
    if bool(args.seq_len) == bool(args.packed):
        ap.error("give exactly one of --seq-len N or --packed L1,L2,...")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "bfloat16" if dev.type == "cuda" else "float16"
    lens = [int(n) for n in args.packed.split(",")] if args.packed else None
    x = make_inputs(sum(lens) if lens else args.seq_len, args.qk_heads, 0, dev, lens, hv=args.v_heads,
                    dtype=dtype)
    with config_overrides(**(json.loads(args.set) if args.set else {})):
        first, second = run_once(x), run_once(x)
    lines = compare(first, second)
    what = f"packed {args.packed}" if args.packed else f"T={args.seq_len}"
    shape = f"{what} {args.qk_heads}/{args.v_heads}"
    print(f"{shape} {args.set or '{}'}: {len(first)} stage calls, "
          + ("every one bit-identical" if not lines else f"{len(lines)} differ; first: {lines[0]}"))
    for line in lines[1:]:
        print("  " + line)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
