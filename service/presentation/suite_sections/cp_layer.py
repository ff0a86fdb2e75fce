"""`cp-layer`: the GatedDeltaNet layer under each CP mode against the layer without CP: accuracy
per tensor, speed and memory with the gain over Ulysses, and weak scaling (the same local
length on more ranks) across the report's world sizes."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from service.domain.compare.judgment import Difference, within_bound_text
from service.presentation import conventions as cv
from service.presentation.estimates import NO_CHANGE
from service.presentation.numbers import fmt
from service.presentation.report_cells import (
    BASE_MODE,
    TIMING_HEADER,
    against_ulysses,
    case_link,
    compare,
    counts,
    gain_text,
    growth_text,
    judged,
    length,
    memory,
    ms,
    rows_of,
    shape_key,
    timing_cells,
    varying,
)
from service.presentation.report_model import (
    NotRun,
    ReportJob,
    Section,
    SuiteInput,
    SuiteReport,
    Sweep,
    SweepSeries,
    Table,
)
from service.presentation.report_tables import Variant
from service.presentation.suite_sections._claims import accuracy_line, across_shapes, worst_errors

TENSORS: tuple[tuple[str, str], ...] = (
    ("output", "output"),
    ("input_grad", "input grad"),
    ("param_grad", "param grads"),
)
GAIN_MODES = ("p2p", "all_gather")  # the CP modes whose gain over Ulysses the tables show
MODE_ORDER = {m: i for i, m in enumerate(("ulysses", "p2p", "all_gather", "p2p_emulated", "none"))}
DISTRIBUTED = ("ulysses", "p2p", "all_gather")
Row = tuple[ReportJob, Variant]


def cp_label(j: ReportJob, v: Variant) -> str:
    shards = v.params.get("shards")
    return f"P{shards} (emulated)" if shards else f"CP{j.world_size}"


def batch_label(v: Variant) -> str:
    p = v.params
    if p.get("packed"):
        return f"packed ×{len(p['packed'])}"
    if p.get("valid_len") is not None:
        return f"B={p.get('batch')}, valid {p['valid_len']}"
    return f"B={p.get('batch', 1)}"


def mode_label(v: Variant, extra: Sequence[str]) -> str:
    """The row's mode, with the other parameters that vary in its table: 'p2p (triton, bfloat16)'."""
    more = ", ".join(str(v.params.get(k, "–")) for k in extra)
    return f"{v.params.get('mode')} ({more})" if more else str(v.params.get("mode"))


def _padded(v: Variant) -> bool:
    """A case with padded positions (a valid length below its sequence) that checks their output."""
    valid, T = v.params.get("valid_len"), v.params.get("seq_len")
    return "padding_output_max_abs" in v.metrics and valid is not None and valid != T


def accuracy(inp: SuiteInput, rows: Sequence[Row]) -> Section | None:
    rows_in = [(j, v) for j, v in rows if any(f"{t}_rel_l2" in v.metrics for t, _ in TENSORS)]
    if not rows_in:
        return None
    extra = varying([v for _, v in rows_in], ("backend", "dtype"))
    out = []
    for j, v in sorted(
        rows_in,
        key=lambda r: (
            r[0].world_size,
            MODE_ORDER.get(r[1].params.get("mode"), 9),
            r[1].params.get("seq_len") or 0,
            batch_label(r[1]),
        ),
    ):
        cells = [
            cp_label(j, v),
            case_link(mode_label(v, extra), j, v, inp.links),
            length(v.params.get("seq_len")),
            batch_label(v),
        ]
        cells += [judged(v.metrics.get(f"{t}_rel_l2")) for t, _ in TENSORS]
        out.append([*cells, judged(v.metrics.get("grad_norm_rel_err"))])
    mode = f"mode ({', '.join(extra)})" if extra else "mode"
    header = ["CP", mode, "T", "batch", *(lab for _, lab in TENSORS), "grad-norm rel err"]
    blocks: list[str | Table] = [
        "Relative-L2 against the layer without CP (eager), worst rank; param grads: "
        "all parameters' gradients together.",
        Table(header, out, keys=4),
    ]
    pads = [(j, v) for j, v in rows if _padded(v)]
    if pads:
        bad = [
            f"{cp_label(j, v)} {v.params.get('mode')} {batch_label(v)} "
            f"({fmt(v.metrics['padding_output_max_abs'].worst)})"
            for j, v in pads
            if v.metrics["padding_output_max_abs"].worst != 0.0
        ]
        blocks.append(
            f"Padding output exactly 0: {'yes' if not bad else 'NO'} in {len(pads) - len(bad)} of "
            f"{len(pads)} padding case(s)" + (f"; not in {', '.join(bad)}." if bad else ".")
        )
    return Section("cp-accuracy", "CP layer accuracy", blocks)


def speed(inp: SuiteInput, rows: Sequence[Row], gains: dict[int, Difference]) -> Section | None:
    if not rows:
        return None
    extra = varying([v for _, v in rows], ("backend", "dtype"))
    out = []
    for j, v in sorted(
        rows,
        key=lambda r: (
            r[0].world_size,
            r[1].params.get("seq_len") or 0,
            batch_label(r[1]),
            MODE_ORDER.get(r[1].params.get("mode"), 9),
        ),
    ):
        tracked = cv.memory_tracked(j.device)
        cells = [
            cp_label(j, v),
            length(v.params.get("seq_len")),
            batch_label(v),
            case_link(mode_label(v, extra), j, v, inp.links),
        ]
        cells += timing_cells(v.metrics.get("fwd_ms"), v.metrics["fwd_bwd_ms"])
        cells += [
            memory(v.metrics.get("peak_allocated_bytes"), tracked),
            memory(v.metrics.get("peak_reserved_bytes"), tracked),
            gain_text(gains[id(v)]) if id(v) in gains else "–",
        ]
        out.append(cells)
    head = (
        f"Times in ms ({counts([v for _, v in rows], ('warmup', 'repeat'))}): median, p90 and min of the "
        "slowest rank per repetition; bwd estimate = median(fwd+bwd) − median(fwd); memory: full-process "
        "peak, max over ranks; gain = time saved against Ulysses on the same backend and shape, (U − P) / U "
        "of the fwd+bwd repetitions, with its 95% interval."
    )
    header = [
        "CP",
        "T",
        "batch",
        f"mode ({', '.join(extra)})" if extra else "mode",
        *TIMING_HEADER,
        "peak allocated",
        "peak reserved",
        "gain vs Ulysses",
    ]
    return Section("cp-speed", "CP layer speed and memory", [head, Table(header, out, keys=4)])


@dataclass(frozen=True)
class Scaling:
    """One mode at one local length from world size `before` to `after`."""

    mode: str
    backend: str
    local: int
    extra: tuple[str, ...]  # the values of the other parameters a series is kept apart by
    before: int
    after: int
    rows: tuple[Row, Row]
    change: Difference


def weak_scaling(
    rows: Sequence[Row], key_params: Sequence[str]
) -> tuple[list[Scaling], dict[int, list[int]]]:
    """Each mode at each local length (T / world size) measured at two or more world sizes, with
    the growth of its fwd+bwd repetitions from one world size to the next; and the local lengths
    each world size ran (to say why there is none)."""
    per: dict[tuple[Any, ...], dict[int, Row]] = {}
    locals_: dict[int, list[int]] = {}
    for j, v in rows:
        p = v.params
        if j.world_size < 2 or p.get("shards") or p.get("mode") not in DISTRIBUTED:
            continue
        if p.get("packed") or p.get("valid_len") is not None or not p.get("seq_len"):
            continue
        local = int(p["seq_len"]) // j.world_size
        locals_.setdefault(j.world_size, []).append(local)
        key = (str(p.get("mode")), str(p.get("backend")), local, tuple(str(p.get(k)) for k in key_params))
        per.setdefault(key, {})[j.world_size] = (j, v)
    found = []
    for key, sizes in per.items():
        for a, b in itertools.pairwise(sorted(sizes)):
            (ja, va), (jb, vb) = sizes[a], sizes[b]
            found.append(
                Scaling(key[0], key[1], key[2], key[3], a, b, (sizes[a], sizes[b]), compare(ja, va, jb, vb))
            )
    found.sort(key=lambda s: (s.extra, s.before, s.after, s.local, MODE_ORDER.get(s.mode, 9)))
    return found, {w: sorted(set(x)) for w, x in locals_.items()}


def scaling_not_run(what: str, locals_: dict[int, list[int]]) -> NotRun:
    """Why weak scaling has no rows: one world size only, or no local length at two of them."""
    if len(locals_) < 2:
        sizes = ", ".join(f"CP{w}" for w in sorted(locals_)) or "no distributed world size"
        return NotRun(what, f"it needs one local length at two world sizes; these jobs ran {sizes} only")
    ran = "; ".join(f"CP{w} at local {', '.join(length(x) for x in xs)}" for w, xs in sorted(locals_.items()))
    return NotRun(
        what,
        f"no local length ran at two world sizes ({ran}); the plan chooses global lengths so that they match",
    )


def scaling_table(
    found: Sequence[Scaling], first: Sequence[str], first_of: Callable[[Scaling], list[str]]
) -> Table:
    rows = [
        [
            *first_of(s),
            f"CP{s.before} → CP{s.after}",
            length(s.local),
            s.mode,
            ms(s.rows[0][1].metrics["fwd_bwd_ms"].median),
            ms(s.rows[1][1].metrics["fwd_bwd_ms"].median),
            growth_text(s.change, NO_CHANGE),
        ]
        for s in found
    ]
    return Table(
        [*first, "world sizes", "local T", "mode", "fwd+bwd before", "fwd+bwd after", "growth"],
        rows,
        keys=len(first) + 3,
    )


def scaling_conclusions(label: Callable[[Scaling], str], found: Sequence[Scaling]) -> list[str]:
    """Per local length: each mode's growth, and which mode grows less where the two growth
    intervals do not overlap (`label` names the series: 'CP layer', 'Network, 4 layers')."""
    out = []
    by: dict[tuple[Any, ...], dict[str, Scaling]] = {}
    for s in found:
        by.setdefault((s.extra, s.before, s.after, s.local), {})[s.mode] = s
    for (_, a, b, local), modes in by.items():
        text = "; ".join(f"{m} {growth_text(s.change, NO_CHANGE)}" for m, s in sorted(modes.items()))
        claim = ""
        p, u = modes.get("p2p"), modes.get(BASE_MODE)
        if p is not None and u is not None:
            if p.change.ci_high < u.change.ci_low:
                claim = "; P2P grows less than Ulysses (their growth intervals do not overlap)"
            elif u.change.ci_high < p.change.ci_low:
                claim = "; P2P grows more than Ulysses (their growth intervals do not overlap)"
            else:
                claim = "; no claim which mode scales better (their growth intervals overlap)"
        name = label(next(iter(modes.values())))
        out.append(
            f"{name} weak scaling CP{a} → CP{b} at local {length(local)}: fwd+bwd growth {text}{claim}."
        )
    return out


def _p2p_vs_ulysses(rows: Sequence[Row]) -> str | None:
    """Each tensor's worst relative-L2 of P2P and of Ulysses over the shapes both ran, against
    their common bound (never as a ratio of two values far below it)."""
    pairs = {(j.job_id, shape_key(v, ("mode",))): v for j, v in rows if v.params.get("mode") == BASE_MODE}
    worst: dict[str, dict[str, float]] = {}
    bounds: dict[str, float] = {}
    for j, v in rows:
        u = pairs.get((j.job_id, shape_key(v, ("mode",))))
        if v.params.get("mode") != "p2p" or u is None:
            continue
        for t, label in TENSORS:
            a, b = v.metrics.get(f"{t}_rel_l2"), u.metrics.get(f"{t}_rel_l2")
            if a is None or b is None or a.bound is None:
                continue
            got = worst.setdefault(label, {"p2p": 0.0, "ulysses": 0.0})
            got["p2p"], got["ulysses"] = max(got["p2p"], a.worst), max(got["ulysses"], b.worst)
            bounds[label] = a.bound
    if not worst:
        return None
    parts = [f"{t}: {within_bound_text(bounds[t], modes)}" for t, modes in worst.items()]
    return "CP layer, P2P and Ulysses against their bound (worst relative-L2 over the shapes both ran): " + (
        "; ".join(parts) + "."
    )


def sweeps(rows: Sequence[Row], found: Sequence[Scaling]) -> list[Sweep]:
    plain = [
        (j, v)
        for j, v in rows
        if v.params.get("seq_len") and v.params.get("valid_len") is None and not v.params.get("packed")
    ]
    dtypes = len({v.params.get("dtype") for _, v in plain}) > 1
    by: dict[str, dict[float, Any]] = {}
    for j, v in plain:
        name = f"{cp_label(j, v)} {v.params.get('mode')}" + (f" {v.params.get('dtype')}" if dtypes else "")
        by.setdefault(name, {})[float(v.params["seq_len"])] = v.metrics["fwd_bwd_ms"]
    out = (
        [
            Sweep(
                "cp-time",
                "CP layer fwd+bwd against global T",
                "global sequence length",
                "ms",
                [_series(n, at) for n, at in sorted(by.items())],
            )
        ]
        if by
        else []
    )
    scale: dict[str, dict[float, Any]] = {}
    several = len({s.extra for s in found}) > 1  # batch or dtype vary: they name the series too
    for s in found:
        name = f"{s.mode} local {length(s.local)}" + (f" {' '.join(s.extra)}" if several else "")
        for j, v in s.rows:
            scale.setdefault(name, {})[float(j.world_size)] = v.metrics["fwd_bwd_ms"]
    if scale:
        out.append(
            Sweep(
                "cp-scaling",
                "CP layer weak scaling: fwd+bwd against world size",
                "world size",
                "ms",
                [_series(n, at) for n, at in sorted(scale.items())],
            )
        )
    return out


def _series(name: str, at: dict[float, Any]) -> SweepSeries:
    sizes = sorted(at)
    return SweepSeries(
        name, sizes, [at[x].median for x in sizes], [at[x].min for x in sizes], [at[x].p90 for x in sizes]
    )


def report(inp: SuiteInput) -> SuiteReport:
    out = SuiteReport()
    rows = rows_of(inp.mine)
    out.add(accuracy(inp, rows))
    timed = [(j, v) for j, v in rows if "fwd_bwd_ms" in v.metrics]
    gains = against_ulysses(timed, GAIN_MODES)
    out.add(speed(inp, timed, gains))
    found, locals_ = weak_scaling(timed, ("batch", "dtype", "qk_heads", "v_heads"))
    if found:
        head = (
            "Weak scaling: the same local length per rank on more ranks; growth = (after − before) / before "
            "of the fwd+bwd repetitions (ms), with its 95% interval."
        )
        out.sections.append(
            Section("cp-scaling", "CP weak scaling", [head, scaling_table(found, [], lambda s: [])])
        )
    elif timed:
        out.not_run.append(scaling_not_run("CP weak scaling", locals_))
    out.plots += sweeps(timed, found)
    line = accuracy_line(
        "CP layer", worst_errors([(j, v) for j, v in rows if not v.params.get("shards")], TENSORS)
    )
    if line:
        out.conclusions.append(line)
    if (line := _p2p_vs_ulysses(rows)) is not None:
        out.conclusions.append(line)
    pads = [v for _, v in rows if _padded(v)]
    if pads:
        zero = sum(v.metrics["padding_output_max_abs"].worst == 0.0 for v in pads)
        out.conclusions.append(f"Padding output exactly 0 in {zero} of {len(pads)} padding case(s).")
    dtypes = len({v.params.get("dtype") for _, v in timed}) > 1
    groups: dict[str, list[tuple[str, Difference]]] = {}
    for j, v in sorted(timed, key=lambda r: r[1].params.get("seq_len") or 0):
        if v.params.get("mode") == "p2p" and id(v) in gains:
            key = f"CP{j.world_size} {batch_label(v)}" + (f" {v.params.get('dtype')}" if dtypes else "")
            groups.setdefault(key, []).append((length(v.params.get("seq_len")), gains[id(v)]))
    for key, xs in sorted(groups.items()):
        out.conclusions.append(
            across_shapes(f"CP layer {key}, P2P gain over Ulysses", xs, "gain", "P2P faster", "P2P slower")
        )
    out.conclusions += scaling_conclusions(lambda s: "CP layer", found)
    return out
