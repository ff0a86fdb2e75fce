"""One measurement, one file: ours, FLA and FlashQLA timed in one device call on the same inputs.

    python3 benchmarks/gdn_one_call.py --out gdn_call.json --seq-lens 16384,32768,65536 \
        --qk-heads 32,16 --processes 3 --accuracy-seeds 0,1,2 [--variant NAME=JSON ...] \
        [--fla-path DIR] [--qla-path DIR] [--deadline 540]

Each backend runs in its own processes (`bench_gdn_peers.py`: the same inputs from the same
seeds, B = 1, Hv = 32, D = 128, bf16, stateful), the processes taken in turns (ours, FLA,
FlashQLA, ours, ...) so that a backend's launch state that differs from process to process shows
as a spread across its processes rather than as one number. FLA runs from `--fla-path` with
`FLA_FLASH_QLA=0` and without FlashQLA's folder on its path (FLA 0.6.0 dispatches to FlashQLA
whenever it can import it); FlashQLA from `--qla-path`. Ours' process 0 also measures accuracy
over `--accuracy-seeds` against the fp32 eager backend (the peers' over `--peer-accuracy-seeds`,
none by default), compares two identical runs bit for bit and runs the `--variant`s; ours' other
processes time the variants too (`--variant-processes`: only processes 0 to N - 1), so that a
variant's ratio to the default is read process by process. Process 0 of every backend runs in the
last turn: its extra work (minutes at 64K) never costs a peer its timing turns before the deadline.

The file records the host, the GPU, the driver, torch / Triton and each backend's versions, the
commit (`--commit`, else the checkout's), a content hash of the code that ran, the start and end
time (UTC) and the command; then every process's own result. `benchmarks/gdn_tables.py` prints
the docs' tables from it, `scripts/readme_figures.py` draws README's figure from it. A process
that fails or passes `--deadline` is recorded with its return code and the end of its output; the
others stay. `--dry-run` runs ours alone on a CPU under TRITON_INTERPRET=1 at a tiny shape (fp16).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FORMAT = "gdn-one-call/1"
BACKENDS = ("ours", "fla", "flashqla")
SETTINGS = ("seq_lens", "qk_heads", "v_heads", "processes", "rep", "warmup", "accuracy_seeds",
            "peer_accuracy_seeds", "variant", "variant_processes", "variant_seq_lens", "set", "backends")


def nvidia_smi(query: str) -> str | None:
    """One field of `nvidia-smi --query-gpu`, or None without the tool (a CPU dry run)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    out = subprocess.run([tool, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=60)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def machine() -> dict[str, Any]:
    """Where the call ran: host, GPU, driver, Python; the code's commit and content hash."""
    from workers.provenance import source_commit, source_content_hash, source_modified

    return {
        "host": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
        "gpu": nvidia_smi("name"), "gpu_memory": nvidia_smi("memory.total"),
        "driver": nvidia_smi("driver_version"), "commit": source_commit(), "modified": source_modified(),
        "code_hash": source_content_hash(),
    }


def child_command(backend: str, index: int, args: argparse.Namespace, out: Path) -> list[str]:
    """bench_gdn_peers.py for process `index` of `backend`."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_gdn_peers.py"), "--backend", backend,
           "--seq-lens", args.seq_lens, "--qk-heads", args.qk_heads, "--rep", str(args.rep),
           "--warmup", str(args.warmup), "--out", str(out)]
    seeds = args.accuracy_seeds if backend == "ours" else args.peer_accuracy_seeds
    cmd += ["--accuracy-seeds", seeds if index == 0 else ""]
    if backend == "ours":
        cmd += [f"--variant={v}" for v in args.variant] if index < args.variant_processes else []
        cmd += ["--variant-seq-lens", args.variant_seq_lens] if args.variant_seq_lens else []
        cmd += ["--variant-accuracy-seeds", args.accuracy_seeds.split(",")[0] if index == 0 else ""]
        if index == 0:
            cmd.append("--repro")
        if args.set:
            cmd += ["--set", args.set]
    if args.dry_run:
        cmd += ["--dry-run", "--dtype", "float16", "--v-heads", str(args.v_heads)]
    return cmd


def child_env(backend: str, args: argparse.Namespace) -> dict[str, str]:
    """The backend's import path: ours from the tree, FLA from its folder with FlashQLA switched
    off and absent, FlashQLA from its folder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    path = [str(ROOT)]
    if backend == "fla":
        path.append(args.fla_path)
        env["FLA_FLASH_QLA"] = "0"
    elif backend == "flashqla":
        path.append(args.qla_path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every process in turn, each written into the result as it ends."""
    backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        raise SystemExit(f"--backends {unknown}: expected some of {list(BACKENDS)}")
    started = time.monotonic()
    result: dict[str, Any] = {
        "format": FORMAT, "command": " ".join(sys.argv), "started_utc": now(), "machine": machine(),
        "settings": {k: getattr(args, k) for k in SETTINGS},
        "processes": [],
    }
    if args.commit:  # a tree copied without its history: the commit it was copied from
        result["machine"].update(commit=args.commit, modified=None, commit_given=True)
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="gdn-one-call-") as tmp:
        for index in [*range(1, args.processes), 0]:
            for backend in backends:
                left = args.deadline - (time.monotonic() - started)
                entry: dict[str, Any] = {"backend": backend, "process": index}
                if left < 5:
                    entry["skipped"] = f"past the {args.deadline} s deadline"
                    result["processes"].append(entry)
                    continue
                path = Path(tmp) / f"{backend}_{index}.json"
                t0 = time.monotonic()
                cmd = child_command(backend, index, args, path)
                try:
                    proc = subprocess.run(cmd, env=child_env(backend, args), capture_output=True, text=True,
                                          timeout=left, cwd=ROOT)
                    entry["rc"], tail = proc.returncode, proc.stdout + proc.stderr
                except subprocess.TimeoutExpired as exc:
                    entry["rc"] = "timeout"
                    got = exc.stdout or b""
                    tail = got.decode(errors="replace") if isinstance(got, bytes) else got
                entry["wall_s"] = round(time.monotonic() - t0, 1)
                entry["output_tail"] = "\n".join(tail.splitlines()[-12:])
                if path.exists():
                    entry["result"] = json.loads(path.read_text())
                result["processes"].append(entry)
                print(f"{backend:8s} process {index}: rc={entry['rc']} {entry['wall_s']} s", flush=True)
                result["ended_utc"] = now()
                out.write_text(json.dumps(result, indent=1))
    return result


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq-lens", default="16384,32768,65536")
    ap.add_argument("--qk-heads", default="32,16")
    ap.add_argument("--v-heads", type=int, default=32, help="value heads (a dry run's; the device's are 32)")
    ap.add_argument("--processes", type=int, default=3, help="processes per backend, taken in turns")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition, ms")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    ap.add_argument("--accuracy-seeds", default="0,1,2", help="ours' accuracy seeds (its first process)")
    ap.add_argument("--peer-accuracy-seeds", default="", help="FLA's and FlashQLA's (default: none)")
    ap.add_argument("--variant", action="append", default=[], help="NAME=JSON: KernelConfig overrides (ours)")
    ap.add_argument("--variant-processes", type=int, default=1 << 30,
                    help="time the variants in ours' first N processes only (default: all)")
    ap.add_argument("--variant-seq-lens", default="", help="the variants' lengths (default: --seq-lens)")
    ap.add_argument("--set", default="", help="KernelConfig overrides (JSON) of ours' default settings")
    ap.add_argument("--fla-path", default="", help="folder holding FLA 0.6.0 (and not FlashQLA)")
    ap.add_argument("--qla-path", default="", help="folder holding FlashQLA 0.1.3 and TileLang")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for all processes together")
    ap.add_argument("--commit", default="", help="the commit measured (default: the checkout's)")
    ap.add_argument("--dry-run", action="store_true", help="ours on a CPU under TRITON_INTERPRET=1 (fp16)")
    args = ap.parse_args()
    if args.dry_run and (args.backends != "ours" or os.environ.get("TRITON_INTERPRET") != "1"):
        print("--dry-run runs --backends ours under TRITON_INTERPRET=1")
        return 2
    result = run_all(args)
    failed = [f"{p['backend']}#{p['process']}" for p in result["processes"] if p.get("rc") not in (0, None)]
    print(f"wrote {args.out}" + (f"; processes that failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
