"""Static census of a GDN kernel's main loop as compiled for Hopper (sm_90), without a GPU.

The state walks are latency-bound: one program per value slice steps through every chunk, so the
instructions each step issues bound how fast it can go. This compiles one recorded launch of a
kernel (the launches `tests/kernels/test_kernels_compile.py` records from the real wiring) for
sm_90 with the installed Triton and its ptxas, disassembles it with the wheel's cuobjdump and
counts the instructions of its main loop (between the target of the longest backward branch and
that branch), or of the whole kernel when it has none, by opcode (STL / LDL: register spills),
and each loop inside the main loop apart, indented by depth: a loop that is not unrolled (the
fused backward's value and key parts) runs its body once per trip, so a step's dynamic count
adds (trips − 1) × that loop's count.
Run it under the Triton version the device runs (the code differs
between versions), e.g. with that wheel unpacked on PYTHONPATH ahead of the installed one:

    python benchmarks/sass_census.py _state_fwd_kernel --where VARLEN=0,HAS_H0=1,STORE_S=1
    python benchmarks/sass_census.py _state_bwd_kernel --where VARLEN=0,HAS_DHT=1,STORE=1 \
        --set '{"state_bv": 16}'

`--where` picks the launch by its constexprs (0/1 for booleans), `--set` applies KernelConfig
overrides before the wiring runs, `--out DIR` keeps the ttgir, ptx and sass.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPS = ("HGMMA", "HMMA", "BAR", "WARPGROUP", "LDGSTS", "LDG", "STG", "LDS", "LDSM", "STS", "STL", "LDL",
       "MUFU", "FMUL", "FFMA", "F2FP", "BRA")


Ops = collections.Counter


def loop_census(sass: str) -> tuple[str, int, Ops, list[tuple[int, int, Ops]]]:
    """Instructions of the longest loop of a cuobjdump -sass listing and their opcodes, or of the
    whole listing when it has no loop (a chunk-parallel stage runs it once per program); and each
    loop inside it (depth, instructions, opcodes), whose bodies run once per trip."""
    ins = [(int(m.group(1), 16), m.group(2).strip())
           for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = []
    for addr, text in ins:
        target = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            loops.append((addr - int(target.group(1), 16), int(target.group(1), 16), addr))

    def census(lo: int, hi: int) -> tuple[int, Ops]:
        body = [text for addr, text in ins if lo <= addr <= hi]
        return len(body), collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                                              for t in body)

    if not loops:
        return "whole kernel", *census(0, ins[-1][0] if ins else -1), []
    _, lo, hi = max(loops)
    inner = []
    for _, a, b in sorted(loops, key=lambda x: x[1]):
        if lo <= a and b <= hi and (a, b) != (lo, hi):
            depth = sum(1 for _, a2, b2 in loops if a2 <= a and b <= b2 and (a2, b2) != (a, b))
            inner.append((depth, *census(a, b)))
    return "main loop", *census(lo, hi), inner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kernel", help="e.g. _state_fwd_kernel")
    ap.add_argument("--where", default="", help="constexpr filter, e.g. VARLEN=0,STORE_S=1")
    ap.add_argument("--set", default="{}", help="JSON of KernelConfig field overrides")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default="", help="folder for the ttgir, ptx and sass")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)

    import torch
    import triton
    from triton.compiler import ASTSource, make_backend

    import kernels.gdn as K
    from tests.kernels import test_kernels_compile as tc

    K.override_for_run(**json.loads(args.set))  # the launches are recorded as the loop below asks
    want = {k: bool(int(v)) if v in "01" else (int(v) if v.isdigit() else v)
            for k, v in (kv.split("=") for kv in args.where.split(",") if kv)}
    target = tc._target()
    for fn, signature, constexprs, attrs, options in tc._distinct_launches(
        getattr(torch, args.dtype), False, make_backend(target)
    ):
        if fn.__name__ != args.kernel:
            continue
        names = {p.num: p.name for p in fn.params}
        ce = {names[p[0]]: v for p, v in constexprs.items() if names[p[0]].isupper()}
        if any(ce.get(k) != v for k, v in want.items()):
            continue
        src = ASTSource(fn, signature, constexprs, attrs)
        ck = triton.compile(src, target=target, options=options.__dict__)
        tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(ck.asm["cubin"])
            cubin.flush()
            sass = subprocess.run([str(tool), "-sass", cubin.name], capture_output=True, text=True,
                                  check=True).stdout
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            for ext in ("ttgir", "ptx"):
                (out / f"{args.kernel}.{ext}").write_text(ck.asm[ext])
            (out / f"{args.kernel}.sass").write_text(sass)
        scope, n, ops, inner = loop_census(sass)
        regs, stack = tc._resources(ck.asm["cubin"])
        print(f"{args.kernel} Triton {triton.__version__} sm_90 {args.dtype} {ce}")
        print(f"  warps={options.num_warps} stages={options.num_stages} shared={ck.metadata.shared} "
              f"regs={regs} stack={stack}")
        print(f"  {scope}: {n} instructions; " + ", ".join(f"{op} {ops[op]}" for op in OPS if ops[op]))
        for depth, n_in, ops_in in inner:
            print(f"  {'  ' * depth}inner loop: {n_in} instructions; "
                  + ", ".join(f"{op} {ops_in[op]}" for op in OPS if ops_in[op]))
        return
    raise SystemExit(f"no launch of {args.kernel} matched {want}")


if __name__ == "__main__":
    main()
