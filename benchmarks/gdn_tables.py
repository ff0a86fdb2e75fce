"""The kernel tables of docs/benchmarks.md, printed from one `gdn_one_call.py` file.

    python3 benchmarks/gdn_tables.py benchmarks/results/FILE.json

Every number of a table comes from that one file, so every ratio is between backends timed in one
device call on the same inputs. A backend's time at a shape is the median over its processes of
each process's fwd+bwd (the lower of its two back-to-back `do_bench` medians), with the spread
over processes beside it (min–max); the forward likewise; the peak and the worst relative L2
(against the fp32 eager backend, over the accuracy seeds) come from each backend's process 0.
A second table gives each `--variant` of ours against the default, process by process; a third
names every backend, variant and shape of the call that has no measurement, with the reason the
file gives (the run's error, or its process's exit, timeout or skip).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORMAT = "gdn-one-call/1"
Shape = tuple[int, int]  # (T, Hqk)


def load(path: Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{path}: format {found!r}; expected {FORMAT!r} (benchmarks/gdn_one_call.py)")
    return doc


def runs(doc: Mapping[str, Any]) -> dict[tuple[str, str, Shape], list[dict[str, Any]]]:
    """(backend, variant, (T, Hqk)) -> that shape's run of every process that measured it, in
    process order, process 0 (the one that measured accuracy) first, whichever turn it ran in (a
    run that raised is left out)."""
    out: dict[tuple[str, str, Shape], list[dict[str, Any]]] = defaultdict(list)
    for proc in sorted(doc["processes"], key=lambda p: p["process"]):
        for r in (proc.get("result") or {}).get("runs", []):
            if "error" not in r and "fwd_bwd_ms" in r:
                r = dict(r, process=proc["process"])
                out[(proc["backend"], r.get("variant", "default"), (int(r["T"]), int(r["hqk"])))].append(r)
    return out


def fwd_bwd(r: Mapping[str, Any]) -> float:
    """One process's fwd+bwd: the lower of its two back-to-back medians."""
    return min(float(r[k]) for k in ("fwd_bwd_ms", "fwd_bwd_ms_again") if r.get(k) is not None)


def summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and spread over processes; peak, accuracy and repeatability from process 0 (the first)."""
    fb = [fwd_bwd(r) for r in rs]
    fw = [float(r["fwd_ms"]) for r in rs]
    first = rs[0]
    errs = first.get("rel_l2") or {}
    return {"fwd_bwd": statistics.median(fb), "fwd_bwd_range": (min(fb), max(fb)),
            "fwd": statistics.median(fw), "fwd_range": (min(fw), max(fw)), "peak": first.get("peak_mib"),
            "worst": first.get("worst_rel_l2"), "worst_tensor": max(errs, key=errs.get) if errs else None,
            "differ": first.get("differ_between_runs"), "processes": len(rs)}


def shapes(table: Mapping[tuple[str, str, Shape], Any]) -> list[Shape]:
    return sorted({s for (_, _, s) in table}, key=lambda s: (s[0], -s[1]))


def _k(t: int) -> str:
    return f"{t // 1024}K" if t % 1024 == 0 else str(t)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "–"


def bar_table(doc: Mapping[str, Any], variant: str = "default") -> str:
    """ours (`variant`) beside FLA and FlashQLA: times, ratios, peak, worst error."""
    table = runs(doc)
    head = ("| T, Hqk | ours fwd+bwd ms | FLA | FlashQLA | ours/FLA | ours/FlashQLA | fwd ours/FLA | "
            "fwd ours/FlashQLA | peak ours/FLA | worst rel-L2 (ours) | ours repeats bit for bit |")
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for shape in shapes(table):
        which = (("ours", variant), ("fla", "default"), ("flashqla", "default"))
        got = {b: summary(table[(b, v, shape)]) for b, v in which if (b, v, shape) in table}
        if "ours" not in got:
            continue
        ours, fla, qla = got["ours"], got.get("fla"), got.get("flashqla")

        def cell(s: dict[str, Any] | None) -> str:
            if s is None:
                return "–"
            lo, hi = s["fwd_bwd_range"]
            return f"{s['fwd_bwd']:.3f} ({lo:.3f}–{hi:.3f})" if s["processes"] > 1 else f"{s['fwd_bwd']:.3f}"

        worst = f"{ours['worst']:.2e} ({ours['worst_tensor']})" if ours["worst"] is not None else "–"
        lines.append(
            f"| {_k(shape[0])}, {shape[1]} | {cell(ours)} | {cell(fla)} | {cell(qla)} | "
            f"{_ratio(ours['fwd_bwd'], fla and fla['fwd_bwd'])} | "
            f"{_ratio(ours['fwd_bwd'], qla and qla['fwd_bwd'])} | "
            f"{_ratio(ours['fwd'], fla and fla['fwd'])} | {_ratio(ours['fwd'], qla and qla['fwd'])} | "
            f"{_ratio(ours['peak'], fla and fla['peak'])} | {worst} | {repeats(ours)} |")
    return "\n".join(lines)


def variant_table(doc: Mapping[str, Any]) -> str:
    """Each variant of ours against the default: the median over processes of each process's own
    ratio (both timed in that process), fwd, fwd+bwd, peak, worst error at its seeds, repeats."""
    table = runs(doc)
    names = sorted({v for (b, v, _) in table if b == "ours" and v != "default"})
    lines = ["| variant | T, Hqk | fwd ms | fwd+bwd ms | fwd+bwd / default | peak MiB | worst rel-L2 "
             "| repeats |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name in names:
        for shape in shapes(table):
            if ("ours", name, shape) not in table:
                continue
            mine = table[("ours", name, shape)]
            base = {r["process"]: r for r in table[("ours", "default", shape)]}
            s = summary(mine)
            ratios = [fwd_bwd(r) / fwd_bwd(base[r["process"]]) for r in mine if r["process"] in base]
            worst = f"{s['worst']:.2e}" if s["worst"] is not None else "–"
            lines.append(f"| {name} | {_k(shape[0])}, {shape[1]} | {s['fwd']:.3f} | {s['fwd_bwd']:.3f} | "
                         f"{statistics.median(ratios):.3f} | {s['peak'] or 0:.0f} | {worst} | {repeats(s)} |"
                         if ratios else f"| {name} | {_k(shape[0])}, {shape[1]} | {s['fwd']:.3f} | "
                         f"{s['fwd_bwd']:.3f} | – | – | {worst} | {repeats(s)} |")
    return "\n".join(lines)


def repeats(s: Mapping[str, Any]) -> str:
    """Whether two identical fwd+bwd of the first process gave the same bits (– when not run)."""
    return "–" if s["differ"] is None else ("yes" if not s["differ"] else f"no: {', '.join(s['differ'])}")


def header(doc: Mapping[str, Any]) -> str:
    m = doc["machine"]
    versions = {}
    for proc in doc["processes"]:
        versions.setdefault(proc["backend"], (proc.get("result") or {}).get("versions", {}))
    ours = versions.get("ours", {})
    peers = ", ".join(f"{n} {versions.get(b, {}).get(mod, '?')}" for b, mod, n in
                      (("fla", "fla", "FLA"), ("flashqla", "flash_qla", "FlashQLA")) if b in versions)
    return (f"{m.get('gpu')} (driver {m.get('driver')}), host {m.get('host')}, torch {ours.get('torch')}, "
            f"Triton {ours.get('triton')}, {peers}; commit {str(m.get('commit'))[:12]}, "
            f"{doc.get('started_utc')} – {doc.get('ended_utc')}; processes per backend (of "
            f"{doc['settings']['processes']} asked): {ran(doc)}")


def ran(doc: Mapping[str, Any]) -> str:
    """Each backend's processes with a result, and those that failed, passed the deadline or were
    skipped (their shapes are missing from the tables)."""
    out = []
    for b in doc["settings"]["backends"].split(","):
        procs = [p for p in doc["processes"] if p["backend"] == b]
        done = sum(1 for p in procs if p.get("rc") == 0)
        short = [f"#{p['process']} {p.get('skipped') or 'rc ' + str(p.get('rc'))}"
                 + (", its shapes so far kept" if p.get("result") else "") for p in procs if p.get("rc") != 0]
        if not procs:
            out.append(f"{b} none")
            continue
        out.append(f"{b} {done} complete" + (f" ({'; '.join(short)})" if short else ""))
    return "; ".join(out)


def expected(doc: Mapping[str, Any]) -> list[tuple[str, str, Shape]]:
    """(backend, variant, shape) of every measurement the call's settings asked for, plus any the
    file holds: each backend's default, ours' `--variant`s, at every (T, Hqk) (the variants at
    `--variant-seq-lens` where given)."""
    st = doc["settings"]

    heads = [int(h) for h in str(st.get("qk_heads", "")).split(",") if h]

    def sizes(lens: str) -> list[Shape]:
        return [(int(t), h) for t in lens.split(",") if t for h in heads]

    variants = st.get("variant") or []
    names = [v.split("=", 1)[0] for v in ([variants] if isinstance(variants, str) else variants)]
    who = [(b, v) for b in str(st.get("backends", "")).split(",") if b
           for v in (["default", *names] if b == "ours" else ["default"])]
    lens = str(st.get("seq_lens", ""))
    want = {(b, v, s) for b, v in who
            for s in sizes(str(st.get("variant_seq_lens") or lens) if v != "default" else lens)}
    for proc in doc["processes"]:
        for r in (proc.get("result") or {}).get("runs", []):
            want.add((proc["backend"], r.get("variant", "default"), (int(r["T"]), int(r["hqk"]))))
    order = {bv: i for i, bv in enumerate(who)}
    return sorted(want, key=lambda k: (order.get(k[:2], len(order)), k[1], k[2][0], -k[2][1]))


def _short(error: str) -> str:
    """An error's first line, cut to fit a table cell."""
    line = next((x.strip() for x in str(error).splitlines() if x.strip()), "error")
    line = line.replace("|", "/")
    return line if len(line) <= 100 else line[:97] + "..."


def _process_end(proc: Mapping[str, Any]) -> str:
    if proc.get("skipped"):
        return f"#{proc['process']} skipped, {proc['skipped']}"
    rc = proc.get("rc")
    wall = f" after {proc['wall_s']:g} s" if proc.get("wall_s") is not None else ""
    return f"#{proc['process']} {'timeout' if rc == 'timeout' else f'rc {rc}'}{wall}"


def failures(doc: Mapping[str, Any]) -> list[tuple[str, str, Shape, str]]:
    """(backend, variant, shape, why) of every measurement asked for that failed or did not
    complete: a run that raised ("failed: its error"), or one that no process measured ("did not
    complete: how its processes ended", or "not run" when no process of the backend started)."""
    done = runs(doc)
    out = []
    for backend, variant, shape in expected(doc):
        procs = [p for p in doc["processes"] if p["backend"] == backend]
        errors = [(p["process"], r["error"]) for p in procs for r in (p.get("result") or {}).get("runs", [])
                  if "error" in r and r.get("variant", "default") == variant
                  and (int(r["T"]), int(r["hqk"])) == shape]
        measured = len(done.get((backend, variant, shape), []))
        if errors:
            where = f" (#{errors[0][0]}; measured in {measured} other processes)" if measured else ""
            out.append((backend, variant, shape, f"failed: {_short(errors[0][1])}{where}"))
        elif not measured:
            ended = [_process_end(p) for p in procs if p.get("rc") != 0]
            why = (f"did not complete: {'; '.join(ended)}" if ended else
                   f"not run: no process of {backend} in the file" if not procs else
                   "not run: absent from every process's result")
            out.append((backend, variant, shape, why))
    return out


def failure_table(doc: Mapping[str, Any]) -> str:
    """A row per failed or missing measurement; ours' default is `ours`, another variant of ours
    goes by its name, a peer by its backend (empty when everything asked for was measured)."""
    rows = failures(doc)
    if not rows:
        return ""
    lines = ["| backend or variant | T, Hqk | not measured |", "| --- | --- | --- |"]
    for backend, variant, shape, why in rows:
        name = backend if variant == "default" else variant
        lines.append(f"| {name} | {_k(shape[0])}, {shape[1]} | {why} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--variant", default="default", help="the variant of ours in the first table")
    args = ap.parse_args()
    doc = load(args.file)
    print(header(doc) + "\n")
    print(bar_table(doc, args.variant) + "\n")
    if any(v != "default" for (b, v, _) in runs(doc) if b == "ours"):
        print(variant_table(doc) + "\n")
    missing = failure_table(doc)
    if missing:
        print(missing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
