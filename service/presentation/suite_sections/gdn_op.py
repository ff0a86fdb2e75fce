"""`gdn-op`: the single-device GDN core's accuracy per tensor and its speed and memory per backend,
with each backend's speed-up over the baseline backend and each own backend against its peers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from service.domain.compare.judgment import Difference
from service.presentation import conventions as cv
from service.presentation import views
from service.presentation.report_cells import (
    TIMING_HEADER,
    case_link,
    compare,
    counts,
    err,
    judged,
    length,
    memory,
    rows_of,
    shape_key,
    speedup_text,
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

# Tensor columns of the accuracy table, as the report names them.
TENSORS: tuple[tuple[str, str], ...] = (
    ("o", "o"),
    ("ht", "final state"),
    ("dq", "dq"),
    ("dk", "dk"),
    ("dv", "dv"),
    ("dg", "dg"),
    ("dbeta", "dbeta"),
    ("dh0", "dh0"),
)
DIMS = ("backend", "mode", "qk_heads", "dtype")
Row = tuple[ReportJob, Variant]


def _order(dims: Sequence[str]) -> Callable[[Row], tuple[Any, ...]]:
    """Rows by their dimensions, then by length."""
    return lambda r: (*[str(r[1].params.get(k)) for k in dims], r[1].params.get("seq_len") or 0)


def accuracy(inp: SuiteInput, rows: Sequence[Row]) -> Section | None:
    rows_in = [(j, v) for j, v in rows if any(f"{t}_rel_l2" in v.metrics for t, _ in TENSORS)]
    if not rows_in:
        return None
    dims = varying([v for _, v in rows_in], DIMS) or ["backend"]
    present = [(t, lab) for t, lab in TENSORS if any(f"{t}_rel_l2" in v.metrics for _, v in rows_in)]
    out = []
    for j, v in sorted(rows_in, key=_order(dims)):
        cells = [case_link(length(v.params.get("seq_len")), j, v, inp.links)]
        cells += [str(v.params.get(k, "–")) for k in dims]
        cells += [judged(v.metrics.get(f"{t}_rel_l2")) for t, _ in present]
        finite = [m for n, m in v.metrics.items() if n.endswith("_finite")]
        cells.append("yes" if finite and all(m.worst == 1.0 for m in finite) else ("NO ✗" if finite else "–"))
        out.append(cells)
    seeds = max(
        (m.count for _, v in rows_in for n, m in v.metrics.items() if n.endswith("_rel_l2")), default=0
    )
    bounds = sorted(
        {
            m.bound
            for _, v in rows_in
            for n, m in v.metrics.items()
            if n.endswith("_rel_l2") and m.bound is not None
        }
    )
    head = (
        f"Relative-L2 ‖a−b‖/‖b‖ per tensor, worst over {seeds} seed(s) and ranks"
        + (f"; bound {', '.join(err(b) for b in bounds)}" if bounds else "")
        + "."
    )
    table = Table(["T", *dims, *(lab for _, lab in present), "finite"], out, keys=1 + len(dims))
    return Section("gdn-accuracy", "Single-device GDN accuracy", [head, table])


def _timed(rows: Sequence[Row]) -> list[Row]:
    return [(j, v) for j, v in rows if "fwd_bwd_ms" in v.metrics and v.metrics["fwd_bwd_ms"].unit == "ms"]


def _baseline_name(v: Variant) -> str:
    return str(v.params.get("baseline") or "eager")


def speedups(rows: Sequence[Row]) -> dict[int, tuple[str, Difference]]:
    """id(variant) -> (its baseline backend, this backend against it: same job and shape)."""
    by = {(j.job_id, shape_key(v, ("backend",)), v.params.get("backend")): (j, v) for j, v in rows}
    out = {}
    for j, v in rows:
        found = by.get((j.job_id, shape_key(v, ("backend",)), _baseline_name(v)))
        if found is not None and found[1] is not v:
            out[id(v)] = (_baseline_name(v), compare(found[0], found[1], j, v))
    return out


def speed(inp: SuiteInput, rows: Sequence[Row], ups: dict[int, tuple[str, Difference]]) -> Section | None:
    if not rows:
        return None
    by = {(j.job_id, shape_key(v, ("backend",)), v.params.get("backend")): v for j, v in rows}
    dims = varying([v for _, v in rows], DIMS) or ["backend"]
    baselines = "/".join(sorted({_baseline_name(v) for _, v in rows}))
    times, versus = [], []
    for j, v in sorted(rows, key=_order(dims)):
        tracked = cv.memory_tracked(j.device)
        keys = [
            case_link(length(v.params.get("seq_len")), j, v, inp.links),
            *(str(v.params.get(k, "–")) for k in dims),
        ]
        times.append([*keys, *timing_cells(v.metrics.get("fwd_ms"), v.metrics["fwd_bwd_ms"])])
        base = by.get((j.job_id, shape_key(v, ("backend",)), _baseline_name(v)))
        peak, ratio = v.metrics.get("peak_bytes"), "–"
        if base is not None and base is not v and peak is not None and tracked:
            bpeak = base.metrics.get("peak_bytes")
            if bpeak is not None and peak.worst > 0 and bpeak.worst > 0:
                ratio = views.memory_versus(peak.worst, bpeak.worst, peak.unit).text
        up = speedup_text(ups[id(v)][1]) if id(v) in ups else "–"
        versus.append([*keys, up, memory(peak, tracked), ratio])
    eager_rows = [v for _, v in rows if v.params.get("backend") == "eager"]
    others = counts([v for _, v in rows if v.params.get("backend") != "eager"], ("warmup", "repeat"))
    eager = counts(eager_rows, ("eager_warmup", "eager_repeat")) or counts(eager_rows, ("warmup", "repeat"))
    reps = "; ".join(x for x in (others, f"eager {eager}" if eager else "") if x)
    any_tracked = any(cv.memory_tracked(j.device) for j, _ in rows)
    head = (
        f"Times in ms over the repetitions ({reps}): median, p90 and min of the slowest rank per "
        "repetition; bwd estimate = median(fwd+bwd) − median(fwd)"
        + (f"; speed-up = the {baselines} fwd+bwd over this one's, with its 95% interval" if ups else "")
        + ("; incremental peak allocated, max over ranks" if any_tracked else "")
        + "."
    )
    k = 1 + len(dims)
    blocks: list[str | Table] = [head, Table(["T", *dims, *TIMING_HEADER], times, keys=k)]
    if ups or any_tracked:  # else the table would hold nothing but "not tracked" (a Not run line says why)
        header = ["T", *dims, f"speed-up vs {baselines}", "incr. peak", f"peak vs {baselines}"]
        blocks.append(Table(header, versus, keys=k))
    return Section("gdn-speed", "Single-device GDN speed and memory", blocks)


def sweep(rows: Sequence[Row]) -> Sweep | None:
    """fwd+bwd against T, one line per backend (and mode where several ran)."""
    by: dict[str, dict[float, Any]] = {}
    for _, v in rows:
        if v.params.get("seq_len"):
            name = str(v.params.get("backend")) + (f" {v.params['mode']}" if v.params.get("mode") else "")
            by.setdefault(name, {})[float(v.params["seq_len"])] = v.metrics["fwd_bwd_ms"]
    if not by:
        return None
    series = [SweepSeries(n, sorted(at), [at[x].median for x in sorted(at)], [at[x].min for x in sorted(at)],
                          [at[x].p90 for x in sorted(at)]) for n, at in sorted(by.items())]
    return Sweep("gdn-time", "Single-device fwd+bwd against T", "sequence length", "ms", series)


def _peer_lines(inp: SuiteInput, rows: Sequence[Row]) -> list[str]:
    """Each own backend (distribution gdnval) against every other backend timed beside it in the
    same job and shape, the baseline aside: how many times faster ours is, per length."""
    own = {
        b["backend"]
        for j in inp.mine
        for b in views.backend_records(j.data.info)
        if b["distribution"] == views.OWN_DISTRIBUTION
    }
    by = {(j.job_id, shape_key(v, ("backend",)), str(v.params.get("backend"))): (j, v) for j, v in rows}
    found: dict[tuple[str, str], list[tuple[int, Difference]]] = {}
    for (job_id, shape, name), (j, v) in by.items():
        if name not in own or name == _baseline_name(v):
            continue
        for (other_job, other_shape, other), (jo, w) in by.items():
            if (other_job, other_shape) != (job_id, shape) or other in own or other == _baseline_name(v):
                continue
            found.setdefault((name, other), []).append(
                (int(v.params.get("seq_len") or 0), compare(jo, w, j, v))
            )
    return [
        across_shapes(
            f"Single-device {name} against {other} (fwd+bwd, {name} as the candidate)",
            [(length(t), d) for t, d in sorted(xs, key=lambda x: x[0])],
            "speedup",
            f"{name} faster",
            f"{name} slower",
        )
        for (name, other), xs in sorted(found.items())
    ]


def report(inp: SuiteInput) -> SuiteReport:
    out = SuiteReport()
    rows = rows_of(inp.mine)
    out.add(accuracy(inp, rows))
    timed = _timed(rows)
    ups = speedups(timed)
    out.add(speed(inp, timed, ups))
    if (found := sweep(timed)) is not None:
        out.plots.append(found)
    if timed and not ups:
        backends = sorted({str(v.params.get("backend")) for _, v in timed})
        out.not_run.append(
            NotRun(
                "Single-device speed-up",
                f"only {', '.join(backends)} timed, no backend beside its baseline (gdn-op's timed_backends)",
            )
        )
    line = accuracy_line("Single-device GDN", worst_errors(rows, TENSORS))
    if line:
        out.conclusions.append(line)
    pairs: dict[str, list[tuple[int, Difference]]] = {}
    for _, v in timed:
        if id(v) in ups:
            base, d = ups[id(v)]
            pairs.setdefault(f"{v.params.get('backend')} vs {base}", []).append(
                (v.params.get("seq_len") or 0, d)
            )
    for pair, xs in sorted(pairs.items()):
        name = pair.split(" vs ")[0]
        out.conclusions.append(
            across_shapes(
                f"Single-device speed-up {pair} (fwd+bwd)",
                [(length(t), d) for t, d in sorted(xs, key=lambda x: x[0])],
                "speedup",
                f"{name} faster",
                f"{name} slower",
            )
        )
    out.conclusions += _peer_lines(inp, timed)
    if timed and not any(cv.memory_tracked(j.device) for j, _ in timed):
        out.not_run.append(NotRun("Single-device memory", "the device keeps no allocator statistics (cpu)"))
    return out
