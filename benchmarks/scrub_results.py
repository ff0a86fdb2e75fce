"""Make a device run's output fit to commit under benchmarks/results/: no machine facts, no paths.

The device returns JSON job results and logs that name its machine: host name, process ids, GPU
UUIDs, the checkout's absolute path, the Python environment's site-packages, the $OUT folder.
This rewrites them (paths become relative or `$OUT/`, UUIDs `GPU-<uuid>`, host/pid/root entries
of `info` go) and, with `--rank0`, keeps only rank 0's samples where every rank reports the same
global values (trajectories), which halves or quarters the file.

    python benchmarks/scrub_results.py SRC DST [--rank0] [--root PATH ...]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

DROPPED_INFO = ("host", "pid", "source_root", "ld_library_path")
_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}")
_SITE = re.compile(r"(?:/[\w.+-]+)+/site-packages/")
_OUT = re.compile(r"/root/out/|(?<![\w/])/tmp/[\w.-]+/out/")
_NVIDIA_LIBS = re.compile(r"/usr/local/nvidia/lib(?:64)?")


def scrub_text(text: str, roots: list[str]) -> str:
    """Every machine-specific substring of `text` replaced; `roots` are checkout paths to drop."""
    for root in sorted(roots, key=len, reverse=True):
        text = text.replace(root.rstrip("/") + "/", "").replace(root.rstrip("/"), ".")
    text = _UUID.sub("GPU-<uuid>", text)
    text = _SITE.sub("", text)
    text = _OUT.sub("$OUT/", text)
    return _NVIDIA_LIBS.sub("<driver libs>", text)


def _without_machine_keys(value: Any) -> Any:
    """`info` and its per-rank entries without host names, process ids and roots."""
    if isinstance(value, dict):
        return {k: _without_machine_keys(v) for k, v in value.items() if k not in DROPPED_INFO}
    if isinstance(value, list):
        return [_without_machine_keys(v) for v in value]
    return value


def scrub_json(data: Any, roots: list[str], rank0: bool = False) -> Any:
    """A job result (the CLI's `--json`) or any JSON value, scrubbed (see the module docstring)."""
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            if key == "info":
                value = _without_machine_keys(value)
            if key == "samples" and rank0 and isinstance(value, list):
                value = [s for s in value if not isinstance(s, dict) or s.get("rank", 0) == 0]
            out[key] = scrub_json(value, roots, rank0)
        return out
    if isinstance(data, list):
        return [scrub_json(v, roots, rank0) for v in data]
    if isinstance(data, str):
        return scrub_text(data, roots)
    return data


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--rank0", action="store_true", help="keep rank 0's samples only (JSON)")
    ap.add_argument("--root", action="append", default=[], help="a checkout path to make relative")
    args = ap.parse_args(argv)
    roots = args.root or [str(Path.cwd())]
    text = args.src.read_text()
    if args.src.suffix == ".json":
        data = scrub_json(json.loads(text), roots, args.rank0)
        args.dst.write_text(json.dumps(data, indent=None, separators=(",", ":")) + "\n")
    else:
        args.dst.write_text(scrub_text(text, roots))
    left = re.findall(r"(?:/root|/home|/work|/opt)/[\w./-]+", args.dst.read_text())
    if left:
        shown = sorted(set(left))[:5]
        raise SystemExit(f"{args.dst}: absolute paths left, give their root with --root: {shown}")


if __name__ == "__main__":
    main()
