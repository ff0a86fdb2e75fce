"""The report's pivoted tables: one row per case variant, one column per tensor or timing.

The hand-written report reads at a glance because its tables are pivoted: rows are mode ×
length (× padding case), columns are the tensors (accuracy) or fwd / fwd+bwd / backward
estimate / peak allocated / peak reserved (speed and memory), with the P2P-vs-Ulysses gain as a
column of its own. The job page keeps the per-metric detail (max abs, max rel, p90, min, n).

A row is a case, or a case and a *variant* when one case measures several backends or CP modes
side by side in its metric names ('triton_fwd_ms', 'eager_fwd_ms'): such a case gives one row
per variant, exactly as if the backend were a case parameter, so the tables read the same
whichever way a suite names its metrics. Everything here is plain data in, plain data out: no
SQL, no Markdown (`service.presentation.report` renders), no FastAPI.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.presentation import conventions, views
from service.presentation.numbers import fmt

# Metric-name prefixes that name a backend or CP mode measured inside one case
# ('triton_fwd_ms'): the rest of the name is the measure, the prefix a row dimension.
VARIANT_TOKENS: tuple[str, ...] = ("triton", "eager", "fla", "ulysses", "p2p", "all_gather", "torch")
# Case parameters shown as row dimensions, in this order (others that vary follow, by name).
DIMENSIONS: tuple[tuple[str, str], ...] = (
    ("mode", "mode"), ("shards", "P"), ("backend", "backend"), ("seq_len", "T"), ("batch", "B"),
    ("valid_len", "valid"), ("dtype", "dtype"), ("qk_heads", "Hqk"), ("v_heads", "Hv"),
)
# Parameters never shown as dimensions: bookkeeping that varies with the others.
NOT_DIMENSIONS = frozenset({"undeclared"})
# Speed and memory columns in the report's order; measures not listed follow, by name.
TIMING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("fwd_ms", "fwd"), ("fwd_bwd_ms", "fwd+bwd"), ("bwd_est_ms", "bwd estimate"),
    ("peak_bytes", "peak alloc (incr.)"), ("peak_allocated_bytes", "peak alloc"),
    ("peak_allocated", "peak alloc"), ("peak_reserved_bytes", "peak reserved"),
    ("peak_reserved", "peak reserved"),
)
STORED_ESTIMATES = views.STORED_ESTIMATES  # shown as median(fwd+bwd) − median(fwd) instead
HEADLINE_TIMES = ("fwd_bwd_ms", "fwd_ms")  # the gain column compares the first one present
HEADLINE_MEMORY = ("peak_bytes", "peak_allocated_bytes", "peak_allocated")  # and the memory one
ACCURACY_LABELS = {"output": "output", "o": "o", "input_grad": "input grad", "param_grad": "param grads"}


@dataclass
class Row:
    """One row: the case it links to, its dimension values, its cells by column key."""

    case: str
    fingerprint: str
    dims: dict[str, str]
    cells: dict[str, views.Cell] = field(default_factory=dict)
    variant: str = ""  # the backend or mode a metric-name prefix named ('' for the case itself)


@dataclass
class Pivot:
    """A pivoted table: dimension columns, then value columns (key, label)."""

    dims: list[tuple[str, str]]
    columns: list[tuple[str, str]]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # check_pivot: bounded checks, failing

    def __bool__(self) -> bool:
        return bool(self.rows)


@dataclass
class Variant:
    """One case (or one backend/mode inside a case) with its metrics keyed by measure name."""

    case: views.CaseStats
    params: dict[str, Any]  # the case's parameters, with the variant as 'backend' or 'mode'
    metrics: dict[str, Any]  # measure name (the prefix stripped) -> MetricStats
    token: str = ""  # the metric-name prefix of this variant ('' for the case's own metrics)


def _variant_of(name: str) -> tuple[str, str] | None:
    """'triton_fwd_ms' -> ('triton', 'fwd_ms'); None for a name that starts with no variant."""
    for token in VARIANT_TOKENS:
        if name.startswith(token + "_") and len(name) > len(token) + 1:
            return token, name[len(token) + 1 :]
    return None


def _variant_key(token: str, params: Mapping[str, Any]) -> str:
    """Which parameter a variant token stands for: a CP mode, or else a backend."""
    return "mode" if token in ("ulysses", "p2p", "all_gather") and "mode" not in params else "backend"


def variants(cases: Sequence[views.CaseStats]) -> list[Variant]:
    """Each case as one variant, or one per backend/mode its metric names measure side by side;
    the metrics of such a case that name no variant (ratios between them) form a row of their
    own, shown only in the tables they have a column in."""
    out: list[Variant] = []
    for c in cases:
        split: dict[str, dict[str, Any]] = {}
        plain: dict[str, Any] = {}
        for name, m in c.metrics.items():
            v = _variant_of(name)
            if v is None:
                plain[name] = m
            else:
                split.setdefault(v[0], {})[v[1]] = m
        for token, ms in split.items():
            out.append(Variant(c, {**c.params, _variant_key(token, c.params): token}, ms, token))
        if plain or not split:
            out.append(Variant(c, dict(c.params), plain))
    return out


def _dim_text(key: str, value: Any) -> str:
    if value is None:
        return "–"
    if key == "seq_len" and isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}K"
    return str(value)


def dimensions(rows: Sequence[Variant]) -> list[tuple[str, str]]:
    """The parameters that vary among `rows` (known ones first, in the report's order); the case
    name when none varies (a single case still needs a row label)."""
    values: dict[str, set[str]] = {}
    for v in rows:
        for k, x in v.params.items():
            if k not in NOT_DIMENSIONS:
                values.setdefault(k, set()).add(views.params_key({"v": x}))
    varying = {k for k, s in values.items() if len(s) > 1 or any(k not in v.params for v in rows)}
    known = [(k, label) for k, label in DIMENSIONS if k in varying]
    rest = sorted(varying - {k for k, _ in DIMENSIONS})
    dims = known + [(k, k) for k in rest]
    return dims or [("case", "case")]


def _row(v: Variant, dims: Sequence[tuple[str, str]]) -> Row:
    texts = {k: (v.case.name if k == "case" else _dim_text(k, v.params.get(k))) for k, _ in dims}
    return Row(v.case.name, v.case.fingerprint, texts, variant=v.token)


def _bad_only(cell: views.Cell) -> views.Cell:
    """A table cell marks only what is wrong: a ✓ on every number is noise in a pivot."""
    return cell if cell.state == "bad" else views.Cell(cell.text, cell.state, "", cell.title)


def _pivot(
    rows: Sequence[Variant],
    cell_of: Callable[[Variant], dict[str, views.Cell]],
    order: Sequence[tuple[str, str]] = (),
    label: Callable[[str], str] = lambda k: k,
) -> Pivot:
    filled = [(v, cells) for v in rows if (cells := cell_of(v))]
    dims = dimensions([v for v, _ in filled])
    present = list(dict.fromkeys(k for _, cells in filled for k in cells))  # first seen first
    known = [(k, lab) for k, lab in order if k in present]
    known_keys = {k for k, _ in known}
    columns = known + [(k, label(k)) for k in present if k not in known_keys]
    out = []
    for v, cells in filled:
        row = _row(v, dims)
        row.cells = cells
        out.append(row)
    return Pivot(dims, columns, out)


# ------------------------------------------------------------------------------------ accuracy


def _in_accuracy(name: str, m: Any, metrics: Mapping[str, Any]) -> bool:
    """`views.in_accuracy_table` for a measure name inside a variant (the prefix stripped)."""
    if m.kind == "accuracy":
        return True
    tensor, stat = views.split_accuracy_metric(name)
    return m.kind == "check" and stat == "finite" and any(
        f"{tensor}_{suffix}" in metrics for suffix in ("rel_l2", "max_abs", "max_rel"))


def accuracy_pivot(cases: Sequence[views.CaseStats]) -> Pivot:
    """Rows: case variants; columns: each tensor's relative-L2 (worst rank, judged by its
    bound), accuracy metrics that name no tensor statistic (a grad-norm error) as their own
    column, and one 'finite' column for every `<tensor>_finite` check of the row."""

    def cells(v: Variant) -> dict[str, views.Cell]:
        out: dict[str, views.Cell] = {}
        bad_finite: list[str] = []
        finite_seen = False
        for name, m in v.metrics.items():
            if not _in_accuracy(name, m, v.metrics):
                continue
            tensor, stat = views.split_accuracy_metric(name)
            if stat == "finite":
                finite_seen = True
                if m.worst != 1.0:
                    bad_finite.append(tensor)
            elif stat is None:
                out[name] = _bad_only(views.judge(m.worst, m))
            elif stat == _shown_stat(tensor, v.metrics):
                key = tensor if stat == "rel_l2" else f"{tensor}_{stat}"
                out[key] = _bad_only(views.judge(m.worst, m))
        if finite_seen:
            out["finite"] = (views.Cell("NO: " + ", ".join(bad_finite), "bad", "✗") if bad_finite
                             else views.Cell("yes", "ok"))
        return out

    def label(key: str) -> str:
        for st, text in (("_max_abs", " (max abs)"), ("_max_rel", " (max rel)")):
            if key.endswith(st):
                return ACCURACY_LABELS.get(key[: -len(st)], key[: -len(st)].replace("_", " ")) + text
        return ACCURACY_LABELS.get(key, key.replace("_", " "))

    p = _pivot(variants(cases), cells, label=label)
    # tensors first (in the order the suite declared them), then the other measures, finite last
    tensors = [c for c in p.columns if c[0] != "finite" and c[0] not in _plain_keys(cases)]
    p.columns = tensors + [c for c in p.columns if c not in tensors and c[0] != "finite"] + [
        c for c in p.columns if c[0] == "finite"
    ]
    p.notes.append("relative-L2 ‖a−b‖/‖b‖ of the worst rank; max abs and max rel per tensor on the job page")
    return p


def _shown_stat(tensor: str, metrics: Mapping[str, Any]) -> str | None:
    """The statistic a tensor's column shows: relative-L2, or the first other one it has."""
    return next((st for st in ("rel_l2", "max_abs", "max_rel") if f"{tensor}_{st}" in metrics), None)


def _plain_keys(cases: Sequence[views.CaseStats]) -> set[str]:
    """Accuracy metric names without a tensor statistic suffix (their own columns)."""
    return {
        (_variant_of(n) or ("", n))[1] for c in cases for n in c.metrics
        if views.split_accuracy_metric(n)[1] is None
    }


# ------------------------------------------------------------------------------- speed, memory


def _time_cell(m: Any) -> views.Cell:
    return _bad_only(views.judge(m.median, m))


def _memory_cell(m: Any, tracked: bool = True) -> views.Cell:
    if not tracked and conventions.allocator_reading(m.metric, m.unit):
        return views.Cell(conventions.NOT_TRACKED)
    v = m.worst
    judged = views.judge(v, m, unit="")
    return _bad_only(views.Cell(views.human_bytes(v, m.unit), judged.state, judged.mark, judged.title))


def _is_timing(m: Any) -> bool:
    return (m.kind == "time" and m.unit in views.TIME_UNITS) or (
        m.kind == "memory" and m.unit.strip().lower() in views.BYTE_UNITS
    )


def _headline(v: Variant) -> tuple[str, float] | None:
    for key in HEADLINE_TIMES:
        m = v.metrics.get(key)
        if m is not None and m.kind == "time" and m.median == m.median and m.median > 0:
            return key, m.median
    return None


def _baseline(v: Variant, by_params: Mapping[str, Variant]) -> tuple[Variant, str, str] | None:
    """The row this one is measured against: the same parameters with the CP mode Ulysses, or
    else with the job's baseline backend (`views.baseline_pairs`, the report's pairing).
    Returns (that row, the parameter that differs, its baseline value)."""
    for key, base in views.baseline_pairs(v.params):
        value = v.params.get(key)
        if value is None or value == base:
            continue
        other = by_params.get(views.params_key({**v.params, key: base}))
        if other is not None:
            return other, key, base
    return None


def timing_pivot(cases: Sequence[views.CaseStats], *, tracked: bool = True,
                 values_of: views.ValuesOf | None = None, device: str | None = None) -> Pivot:
    """Rows: case variants; columns: fwd / fwd+bwd / backward estimate (median(fwd+bwd) −
    median(fwd) of the shown medians) / peak allocated / peak reserved, then against the baseline
    row: the gain (time saved) of a CP mode over Ulysses, the speed-up of a backend over the
    job's baseline backend (eager unless the job names another); the headers name the baseline.
    `tracked` False (a CPU) shows allocator readings as "not tracked". The gain and speed-up
    carry their interval from the repetitions `values_of` gives (`views.versus_cell`)."""
    rows = variants(cases)
    by_params = {views.params_key(v.params): v for v in rows}

    def cells(v: Variant) -> dict[str, views.Cell]:
        out: dict[str, views.Cell] = {}
        for name, m in v.metrics.items():
            if _is_timing(m) and name not in STORED_ESTIMATES:
                out[name] = _time_cell(m) if m.kind == "time" else _memory_cell(m, tracked)
        fwd, both = v.metrics.get("fwd_ms"), v.metrics.get("fwd_bwd_ms")
        if fwd is not None and both is not None and fwd.unit == both.unit:
            est = conventions.bwd_estimate(fwd.median, both.median)
            out["bwd_est_ms"] = views.Cell(fmt(est, views.shown_unit(fwd.unit)), "none", "",
                                           "median(fwd+bwd) − median(fwd)")
        if not out:
            return out
        head, against = _headline(v), _baseline(v, by_params)
        if against is None:
            return out
        other, key, base_name = against
        base = other.metrics.get(head[0]) if head is not None else None
        if head is not None and base is not None and base.median == base.median:
            this = v.metrics[head[0]]
            values = values_of or (lambda fp, metric: None)
            cell = views.versus_cell(base, this, values(other.case.fingerprint, base.metric),
                                     values(v.case.fingerprint, this.metric), device=device,
                                     cp_mode=key == "mode")
            column = "gain" if key == "mode" else "speedup"
            out[column] = views.Cell(cell.text, cell.state, "", f"{cell.title} (vs {base_name})")
        mem = next((k for k in HEADLINE_MEMORY if k in v.metrics and k in other.metrics), None)
        if mem is not None and tracked:
            mine, theirs = v.metrics[mem].worst, other.metrics[mem].worst
            if mine > 0 and theirs > 0:
                out["memory_vs"] = views.memory_versus(mine, theirs, v.metrics[mem].unit)
        return out

    p = _pivot(rows, cells, TIMING_COLUMNS, label=_timing_label)
    pairs = [b for v in rows if (b := _baseline(v, by_params)) is not None]
    modes = " / ".join(sorted({b[2] for b in pairs if b[1] == "mode"}))
    backends = " / ".join(sorted({b[2] for b in pairs if b[1] != "mode"}))
    every = " / ".join(sorted({b[2] for b in pairs}))
    relative = {"gain": f"gain vs {modes}", "speedup": f"speed-up vs {backends}",
                "memory_vs": f"peak alloc vs {every}"}
    keys = {k for k, _ in p.columns}
    p.columns = [c for c in p.columns if c[0] not in relative] + [
        (k, label) for k, label in relative.items() if k in keys
    ]
    if "gain" in keys:
        p.notes.append("gain: time saved, (U − P) / U of the median fwd+bwd (U: the Ulysses row of the "
                       "same parameters)")
    if "speedup" in keys:
        p.notes.append("speed-up: the baseline backend's median fwd+bwd / this row's (same parameters)")
    if keys & {"gain", "speedup"}:
        p.notes.append(views.VERSUS_NOTE)
    p.notes.insert(0, "times: median of the slowest rank per repetition; bwd estimate: median(fwd+bwd) − "
                      "median(fwd); memory: max over ranks")
    return p


def _timing_label(key: str) -> str:
    for suffix in ("_ms", "_bytes"):
        if key.endswith(suffix):
            return key[: -len(suffix)].replace("_", " ")
    return key.replace("_", " ")


# ------------------------------------------------------------------------- checks, trajectories


def check_pivot(cases: Sequence[views.CaseStats]) -> Pivot:
    """Rows: case variants with check metrics; columns: how many bounded checks hold, the ones
    that do not with their values, and the values recorded without a bound. `counts` holds the
    totals, so a report can say "all N hold" in one line."""
    totals = {"checks": 0, "failing": 0, "recorded": 0}

    def cells(v: Variant) -> dict[str, views.Cell]:
        checks = [(n, m) for n, m in v.metrics.items()
                  if m.kind == "check" and not _in_accuracy(n, m, v.metrics)]
        if not checks:
            return {}
        judged = [(m.metric, views.judge(m.worst, m)) for _, m in checks if m.bound is not None]
        recorded = [f"{m.metric} = {fmt(m.worst)}" for _, m in checks if m.bound is None]
        bad = [f"{n} = {c.text}" for n, c in judged if c.state == "bad"]
        totals["checks"] += len(judged)
        totals["failing"] += len(bad)
        totals["recorded"] += len(recorded)
        held = f"{len(judged) - len(bad)}/{len(judged)}" if judged else "–"
        return {
            "passed": views.Cell(held, "bad" if bad else ("ok" if judged else "none")),
            "failing": views.Cell("; ".join(bad) if bad else "–", "bad" if bad else "none"),
            "recorded": views.Cell("; ".join(recorded) if recorded else "–"),
        }

    columns = (
        ("passed", "bounded checks holding"), ("failing", "failing"), ("recorded", "recorded, no bound")
    )
    p = _pivot(variants(cases), cells, columns)
    p.counts = totals
    return p


def trajectory_pivot(cases: Sequence[views.CaseStats]) -> Pivot:
    """Rows: case variants; columns: each trajectory metric's worst value over steps and ranks
    against its bound (NaN/Inf fails)."""

    def cells(v: Variant) -> dict[str, views.Cell]:
        return {n: _bad_only(views.judge(m.worst, m))
                for n, m in v.metrics.items() if m.kind == "trajectory"}

    p = _pivot(variants(cases), cells, label=lambda k: k.replace("_", " "))
    p.notes.append("worst value over steps and ranks; per-step plots on the job page")
    return p


# ------------------------------------------------------------------------ one row per case variant


def case_pivot(cases: Sequence[views.CaseStats], *, tracked: bool = True,
               values_of: views.ValuesOf | None = None, device: str | None = None) -> Pivot:
    """What `gdnval run` prints: one row per case variant with its key numbers as columns (the
    bounded checks holding, the worst tensor relative-L2, fwd / fwd+bwd / peak and the gain
    from the timing table) and the metrics out of bound. Rows keep the cases' order."""
    timed = timing_pivot(cases, tracked=tracked, values_of=values_of, device=device)
    timing = {(r.fingerprint, r.variant): r.cells for r in timed.rows}
    keep = ("fwd_ms", "fwd_bwd_ms", *HEADLINE_MEMORY, "gain", "speedup")

    def cells(v: Variant) -> dict[str, views.Cell]:
        out: dict[str, views.Cell] = {}
        judged = [(m.metric, views.judge(m.worst, m)) for n, m in v.metrics.items()
                  if m.bound is not None and m.kind in ("check", "accuracy", "trajectory")]
        if judged:
            held = sum(c.state != "bad" for _, c in judged)
            out["bounds"] = views.Cell(f"{held}/{len(judged)}", "ok" if held == len(judged) else "bad")
        rel = [(m.worst, t, m) for n, m in v.metrics.items() if m.kind == "accuracy" and not m.diagnostic
               and (t := views.split_accuracy_metric(n))[1] == "rel_l2"]
        if rel:
            value, (tensor, _), m = max(rel, key=lambda x: -math.inf if x[0] != x[0] else x[0])
            cell = _bad_only(views.judge(value, m))
            out["worst_rel_l2"] = views.Cell(f"{cell.text} ({tensor})", cell.state, cell.mark, cell.title)
        out.update({k: c for k, c in timing.get((v.case.fingerprint, v.token), {}).items() if k in keep})
        bad = [name for name, c in judged if c.state == "bad"]
        if bad:
            out["out_of_bound"] = views.Cell(", ".join(bad), "bad")
        return out

    order = (("bounds", "bounds held"), ("worst_rel_l2", "worst rel-L2"), *TIMING_COLUMNS,
             ("gain", "gain"), ("speedup", "speed-up"), ("out_of_bound", "out of bound"))
    p = _pivot(variants(cases), cells, order, label=_timing_label)
    p.columns = [c for c in p.columns if c[0] != "out_of_bound"] + [
        c for c in p.columns if c[0] == "out_of_bound"
    ]
    return p
