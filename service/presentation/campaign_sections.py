"""The campaign report's sections as plain data, in the order of the hand-written PR report.

Plain data in (the stored jobs of one campaign: `service.presentation.report.JobData` with their case
summaries, artifact names, comparisons with a base campaign), plain data out (`Section`s of
paragraphs and tables of text); no SQL and no Markdown syntax beyond links in cells, so a page can
draw the same tables and a test can plant the numbers. Every number follows one rule
(`service.presentation.conventions`). A section whose data the jobs do not hold is left out,
never printed empty.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from service.presentation import conventions as cv
from service.presentation import views
from service.presentation.numbers import fmt
from service.presentation.report_tables import Variant, variants

# Tensor columns of the single-device accuracy table, as the report names them.
GDN_TENSORS: tuple[tuple[str, str], ...] = (
    ("o", "o"), ("ht", "final state"), ("dq", "dq"), ("dk", "dk"), ("dv", "dv"), ("dg", "dg"),
    ("dbeta", "dbeta"), ("dh0", "dh0"),
)
CP_TENSORS: tuple[tuple[str, str], ...] = (
    ("output", "output"),
    ("input_grad", "input grad"),
    ("param_grad", "param grads"),
)
BASE_MODE = "ulysses"
GAIN_MODES = ("p2p", "all_gather")  # the CP modes whose gain over Ulysses the tables show
# Relative-L2 errors below this are rounding of an fp64 run: two of them count as equal.
ROUNDING_FLOOR = 1e-12
# Conclusions' thresholds, stated in the conclusions themselves.
GROWTH_FACTOR = 2.0  # an error "grows with T" when the longest T's worst exceeds this × the shortest's
MAX_NAMED_FAILURES = 30  # the conclusions name this many failing cases, then count the rest
SAME_SIZE_FACTOR = 1.5  # P2P and Ulysses errors are "the same size" when their ratio is within this


EMPTY_CELLS = ("", "–")


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]

    def without_empty_columns(self) -> Table:
        """The table without the columns no row has a value in (a gain against Ulysses in a
        campaign without Ulysses); the first column, which names the row, always stays."""
        keep = [i for i in range(len(self.header))
                if i == 0 or any(r[i].strip() not in EMPTY_CELLS for r in self.rows)]
        return Table([self.header[i] for i in keep], [[r[i] for i in keep] for r in self.rows])


@dataclass
class Section:
    """One concern of the report: a title and blocks (a paragraph line or a table), in order."""

    key: str
    title: str
    blocks: list[str | Table] = field(default_factory=list)


@dataclass
class CampaignJob:
    """One stored job of the campaign with what the report reads besides its case summaries."""

    data: Any  # service.presentation.report.JobData
    artifacts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Links:
    """Links into the pages from a public base URL; none at all without one."""

    base: str | None = None

    def job(self, job_id: int) -> str | None:
        return f"{self.base}/jobs/{job_id}" if self.base else None

    def case(self, job_id: int, fingerprint: str) -> str | None:
        return f"{self.base}/jobs/{job_id}#case-{fingerprint}" if self.base else None

    def artifact(self, job_id: int, name: str) -> str | None:
        return f"{self.base}/api/v1/jobs/{job_id}/artifacts/{quote(name, safe='/')}" if self.base else None


def link(text: str, url: str | None) -> str:
    text = str(text).replace("|", "\\|")
    return f"[{text}]({url})" if url else text


# ------------------------------------------------------------------------------------- numbers


def _ms(value: float | None) -> str:
    """A time in ms as the report prints it: three decimals (160.283)."""
    if value is None or not math.isfinite(value):
        return "–" if value is None else fmt(value)
    return f"{value:.3f}"


def _err(value: float | None) -> str:
    return "–" if value is None else fmt(value)


def _worst(m: Any) -> float | None:
    return None if m is None else m.worst


def _median(m: Any) -> float | None:
    return None if m is None else m.median


def _length(value: Any) -> str:
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}K"
    return "–" if value is None else str(value)


def _layers(model: Any) -> str:
    """'qwen35-8l' -> '8'; other model names as they are."""
    found = re.search(r"(\d+)l$", str(model or ""))
    return found.group(1) if found else str(model or "–")


def _mark(m: Any, value: float | None) -> str:
    """' ✗' after a value that breaks its metric's bound (or is not finite), else ''."""
    if m is None or value is None:
        return ""
    return " ✗" if views.judge(value, m).state == "bad" else ""


def _counts(variants_: Iterable[Variant], params: Sequence[str]) -> str:
    """'warm-up 5, repeat 20' from the rows' parameters (every distinct value named)."""
    parts = []
    for key, label in zip(params, ("warm-up", "repeat"), strict=True):
        values = sorted({v.params.get(key) for v in variants_ if v.params.get(key) is not None}, key=str)
        if values:
            parts.append(f"{label} {'/'.join(str(x) for x in values)}")
    return ", ".join(parts)


def _varying(rows: Sequence[Variant], keys: Sequence[str]) -> list[str]:
    return [k for k in keys if len({views.params_key({"v": r.params.get(k)}) for r in rows}) > 1]


def _shape_key(v: Variant, drop: Iterable[str]) -> str:
    dropped = set(drop)
    return views.params_key({k: x for k, x in v.params.items() if k not in dropped})


def _timing_cells(fwd: Any, both: Any) -> list[str]:
    """fwd / fwd+bwd median / p90 / min / bwd estimate: the estimate is the difference of the
    two medians printed beside it."""
    return [
        _ms(_median(fwd)), _ms(_median(both)), _ms(None if both is None else both.p90),
        _ms(None if both is None else both.min), _ms(cv.bwd_estimate(_median(fwd), _median(both))),
    ]


TIMING_HEADER = ["fwd", "fwd+bwd", "fwd+bwd p90", "fwd+bwd min", "bwd estimate"]


def _cp_timing_cells(
    j: CampaignJob, v: Variant, gains: Mapping[int, str], between: Sequence[str] = ()
) -> list[str]:
    """A CP row's timings (`_timing_cells`), then `between`, its peak allocated and reserved
    memory and its gain over Ulysses (`_gain_against`)."""
    tracked = cv.memory_tracked(j.data.device)
    return [
        *_timing_cells(v.metrics.get("fwd_ms"), v.metrics["fwd_bwd_ms"]), *between,
        _memory(v.metrics.get("peak_allocated_bytes"), tracked),
        _memory(v.metrics.get("peak_reserved_bytes"), tracked), gains.get(id(v), "–"),
    ]


def _memory(m: Any, tracked: bool) -> str:
    """A peak reading (max over ranks); "not tracked" on a device without allocator statistics."""
    if m is None:
        return "–" if tracked else cv.NOT_TRACKED
    return cv.memory_text(m.worst, m.unit, tracked=tracked)


# ------------------------------------------------------------------------------------ sections


def _suite_jobs(jobs: Sequence[CampaignJob], suite: str) -> list[CampaignJob]:
    return [j for j in jobs if j.data.suite == suite]


def _rows_of(jobs: Sequence[CampaignJob], suite: str) -> list[tuple[CampaignJob, Variant]]:
    return [(j, v) for j in _suite_jobs(jobs, suite) for v in variants(j.data.cases)]


def environment(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    if not jobs:
        return None
    rows = []
    for j in jobs:
        d, info = j.data, j.data.info
        device = f"{info.get('device_name') or d.device} ({d.device} × {d.world_size})"
        sw = ", ".join(f"{k} {info[k]}" for k in ("torch", "triton", "python") if info.get(k))
        rows.append(
            [
                link(f"#{d.job_id}", links.job(d.job_id)),
                d.suite,
                d.preset,
                device,
                sw or "–",
                f"`{(d.commit or info.get('commit') or 'unknown')[:12]}`",
                d.verdict or d.status,
            ]
        )
    blocks: list[str | Table] = [Table(["job", "suite", "preset", "device", "software", "commit", "verdict"],
                                       rows)]
    backends: dict[tuple[str, ...], None] = {}
    for j in jobs:
        for b in views.backend_records(j.data.info):
            backends[(b["backend"], b["distribution"], b["version"], b["commit"][:12] or "–")] = None
    if backends:
        blocks.append(Table(["backend", "distribution", "version", "commit"], [list(b) for b in backends]))
    return Section("environment", "Environment and backends", blocks)


def capability(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    rows = []
    for j in _suite_jobs(jobs, "capability"):
        for c, view in zip(j.data.cases, views.case_views(j.data.cases), strict=True):
            bounded = [m for m in c.metrics.values() if m.bound is not None]
            held = sum(views.judge(m.worst, m).state != "bad" for m in bounded)
            failing = [m.metric for m in bounded if views.judge(m.worst, m).state == "bad"]
            outcome = (
                view.status
                if not c.expected_error
                else (f"raised {c.expected_error}" if view.status == "expected error" else view.status)
            )
            rows.append(
                [
                    link(c.name, links.case(j.data.job_id, c.fingerprint)),
                    outcome,
                    f"{held}/{len(bounded)}" if bounded else "–",
                    ", ".join(failing) or "–",
                ]
            )
    if not rows:
        return None
    return Section(
        "capability",
        "Capability and fail-fast",
        [Table(["case", "outcome", "bounded checks holding", "failing"], rows)],
    )


def gdn_accuracy(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    rows_in = [(j, v) for j, v in _rows_of(jobs, "gdn-op")
               if any(f"{t}_rel_l2" in v.metrics for t, _ in GDN_TENSORS)]
    if not rows_in:
        return None
    dims = _varying([v for _, v in rows_in], ("backend", "mode", "qk_heads", "dtype")) or ["backend"]
    present = [(t, lab) for t, lab in GDN_TENSORS if any(f"{t}_rel_l2" in v.metrics for _, v in rows_in)]
    rows = []
    for j, v in sorted(rows_in, key=lambda r: (*[str(r[1].params.get(k)) for k in dims],
                                               r[1].params.get("seq_len") or 0)):
        cells = [link(_length(v.params.get("seq_len")), links.case(j.data.job_id, v.case.fingerprint))]
        cells += [str(v.params.get(k, "–")) for k in dims]
        for t, _ in present:
            m = v.metrics.get(f"{t}_rel_l2")
            cells.append(_err(_worst(m)) + _mark(m, _worst(m)))
        finite = [m for n, m in v.metrics.items() if n.endswith("_finite")]
        cells.append(
            "yes" if finite and all(m.worst == 1.0 for m in finite) else ("NO ✗" if finite else "–")
        )
        rows.append(cells)
    seeds = max(
        (m.count for _, v in rows_in for n, m in v.metrics.items() if n.endswith("_rel_l2")), default=0
    )
    bounds = sorted({m.bound for _, v in rows_in for n, m in v.metrics.items()
                     if n.endswith("_rel_l2") and m.bound is not None})
    head = (
        f"Relative-L2 ‖a−b‖/‖b‖ per tensor, worst over {seeds} seed(s) and ranks"
        + (f"; bound {', '.join(fmt(b) for b in bounds)}" if bounds else "")
        + "."
    )
    return Section(
        "gdn-accuracy",
        "Single-device GDN accuracy",
        [head, Table(["T", *dims, *(lab for _, lab in present), "finite"], rows)],
    )


def gdn_speed(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    rows_in = [(j, v) for j, v in _rows_of(jobs, "gdn-op") if "fwd_bwd_ms" in v.metrics
               and v.metrics["fwd_bwd_ms"].unit == "ms"]
    if not rows_in:
        return None
    by_shape = {(j.data.job_id, _shape_key(v, ("backend",)), v.params.get("backend")): v for j, v in rows_in}
    dims = _varying([v for _, v in rows_in], ("backend", "mode", "qk_heads", "dtype")) or ["backend"]
    baselines = sorted({str(v.params.get("baseline") or "eager") for _, v in rows_in})
    rows = []
    for j, v in sorted(rows_in, key=lambda r: (*[str(r[1].params.get(k)) for k in dims],
                                               r[1].params.get("seq_len") or 0)):
        tracked = cv.memory_tracked(j.data.device)
        base_name = str(v.params.get("baseline") or "eager")
        base = by_shape.get((j.data.job_id, _shape_key(v, ("backend",)), base_name))
        both, peak = v.metrics["fwd_bwd_ms"], v.metrics.get("peak_bytes")
        speed = (
            "–"
            if base is None or base is v
            else cv.speedup_text(base.metrics["fwd_bwd_ms"].median, both.median)
        )
        ratio = "–"
        if base is not None and base is not v and peak is not None and tracked:
            bpeak = base.metrics.get("peak_bytes")
            if bpeak is not None and peak.worst > 0 and bpeak.worst > 0:
                ratio = views.memory_versus(peak.worst, bpeak.worst, peak.unit).text
        cells = [link(_length(v.params.get("seq_len")), links.case(j.data.job_id, v.case.fingerprint))]
        cells += [str(v.params.get(k, "–")) for k in dims]
        cells += _timing_cells(v.metrics.get("fwd_ms"), both)
        cells += [speed, _memory(peak, tracked), ratio]
        rows.append(cells)
    vs = "/".join(baselines)
    eager_rows = [v for _, v in rows_in if v.params.get("backend") == "eager"]
    others = _counts([v for _, v in rows_in if v.params.get("backend") != "eager"], ("warmup", "repeat"))
    eager = _counts(eager_rows, ("eager_warmup", "eager_repeat")) or _counts(eager_rows, ("warmup", "repeat"))
    counts = "; ".join(x for x in (others, f"eager {eager}" if eager else "") if x)
    head = (
        f"Times in ms over the repetitions ({counts}): median, "
        "p90 and min of the slowest rank per repetition; bwd estimate = median(fwd+bwd) − median(fwd); "
        f"speed-up = the {vs} median fwd+bwd / this one; incremental peak allocated, max over ranks."
    )
    header = ["T", *dims, *TIMING_HEADER, f"speed-up vs {vs}", "incr. peak", f"peak vs {vs}"]
    return Section("gdn-speed", "Single-device GDN speed and memory", [head, Table(header, rows)])


def _cp_label(j: CampaignJob, v: Variant) -> str:
    shards = v.params.get("shards")
    return f"P{shards} (emulated)" if shards else f"CP{j.data.world_size}"


def _padding(v: Variant) -> str:
    p = v.params
    if p.get("packed"):
        return f"packed ×{len(p['packed'])}"
    if p.get("valid_len") is not None:
        return f"B={p.get('batch')}, valid {p['valid_len']}"
    return f"B={p.get('batch', 1)}"


def _padded(v: Variant) -> bool:
    """A case with padded positions (a valid length below its sequence) that checks their output."""
    valid, T = v.params.get("valid_len"), v.params.get("seq_len")
    return "padding_output_max_abs" in v.metrics and valid is not None and valid != T


def cp_accuracy(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    rows_in = [(j, v) for j, v in _rows_of(jobs, "cp-layer")
               if any(f"{t}_rel_l2" in v.metrics for t, _ in CP_TENSORS)]
    if not rows_in:
        return None
    extra = _varying([v for _, v in rows_in], ("backend", "dtype"))
    rows = []
    order = {m: i for i, m in enumerate(("ulysses", "p2p", "all_gather", "p2p_emulated", "none"))}
    for j, v in sorted(rows_in, key=lambda r: (r[0].data.world_size, order.get(r[1].params.get("mode"), 9),
                                               r[1].params.get("seq_len") or 0, _padding(r[1]))):
        cells = [
            _cp_label(j, v),
            link(str(v.params.get("mode")), links.case(j.data.job_id, v.case.fingerprint)),
        ]
        cells += [str(v.params.get(k, "–")) for k in extra]
        cells += [_length(v.params.get("seq_len")), _padding(v)]
        for t, _ in CP_TENSORS:
            m = v.metrics.get(f"{t}_rel_l2")
            cells.append(_err(_worst(m)) + _mark(m, _worst(m)))
        g = v.metrics.get("grad_norm_rel_err")
        cells.append(_err(_worst(g)) + _mark(g, _worst(g)))
        rows.append(cells)
    header = ["CP", "mode", *extra, "T", "batch", *(lab for _, lab in CP_TENSORS), "grad-norm rel err"]
    blocks: list[str | Table] = ["Relative-L2 against the layer without CP (eager), worst rank; param grads: "
                                 "all parameters' gradients together.", Table(header, rows)]
    pads = [(j, v) for j, v in _rows_of(jobs, "cp-layer") if _padded(v)]
    if pads:
        at = {id(v): v.metrics["padding_output_max_abs"].worst for _, v in pads}
        bad = [f"{_cp_label(j, v)} {v.params.get('mode')} {_padding(v)} ({fmt(at[id(v)])})"
               for j, v in pads if at[id(v)] != 0.0]
        blocks.append(
            f"Padding output exactly 0: {'yes' if not bad else 'NO'} in {len(pads) - len(bad)} of "
            f"{len(pads)} padding case(s)" + (f"; not in {', '.join(bad)}." if bad else ".")
        )
    return Section("cp-accuracy", "CP layer accuracy", blocks)


def _gain_against(
    rows: Sequence[tuple[CampaignJob, Variant]], metric: str, drop: Sequence[str] = ("mode",)
) -> dict[int, str]:
    """id(variant) -> the gain of each non-Ulysses row over the Ulysses row of the same job and
    parameters (same backend): time saved (U − P) / U of the medians."""
    by = {(j.data.job_id, _shape_key(v, drop)): v for j, v in rows if v.params.get("mode") == BASE_MODE}
    out = {}
    for j, v in rows:
        base = by.get((j.data.job_id, _shape_key(v, drop)))
        if v.params.get("mode") not in GAIN_MODES or base is None or metric not in base.metrics:
            continue
        out[id(v)] = cv.gain_text(base.metrics[metric].median, v.metrics[metric].median)
    return out


def cp_speed(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    rows_in = [(j, v) for j, v in _rows_of(jobs, "cp-layer") if "fwd_bwd_ms" in v.metrics]
    if not rows_in:
        return None
    gains = _gain_against(rows_in, "fwd_bwd_ms")
    extra = _varying([v for _, v in rows_in], ("backend", "dtype"))
    order = {m: i for i, m in enumerate(("ulysses", "p2p", "all_gather", "p2p_emulated", "none"))}
    rows = []

    def place(r: tuple[CampaignJob, Variant]) -> tuple[Any, ...]:
        return (r[0].data.world_size, r[1].params.get("seq_len") or 0, _padding(r[1]),
                order.get(r[1].params.get("mode"), 9))

    for j, v in sorted(rows_in, key=place):
        cells = [
            _cp_label(j, v),
            _length(v.params.get("seq_len")),
            _padding(v),
            link(str(v.params.get("mode")), links.case(j.data.job_id, v.case.fingerprint)),
        ]
        cells += [str(v.params.get(k, "–")) for k in extra]
        rows.append(cells + _cp_timing_cells(j, v, gains))
    counts = _counts([v for _, v in rows_in], ("warmup", "repeat"))
    head = (
        f"Times in ms ({counts}): median, p90 and min of the slowest rank per repetition; bwd estimate "
        "= median(fwd+bwd) − median(fwd); memory: full-process peak, max over ranks; gain = time saved "
        "against Ulysses on the same backend and shape, (U − P) / U of the fwd+bwd medians."
    )
    header = ["CP", "T", "batch", "mode", *extra, *TIMING_HEADER,
              "peak allocated", "peak reserved", "gain vs Ulysses"]
    return Section("cp-speed", "CP layer speed and memory", [head, Table(header, rows)])


def cp_scaling(jobs: Sequence[CampaignJob], links: Links) -> tuple[Section | None, list[dict[str, Any]]]:
    """CP4 → CP8 (each pair of world sizes) at the same local length: growth of the fwd+bwd median."""
    per: dict[tuple[str, ...], dict[int, float]] = {}
    for j, v in _rows_of(jobs, "cp-layer"):
        p = v.params
        if j.data.world_size < 2 or p.get("shards") or p.get("mode") not in ("ulysses", "p2p", "all_gather"):
            continue
        if "fwd_bwd_ms" not in v.metrics or p.get("packed") or p.get("valid_len") is not None:
            continue
        local = int(p.get("seq_len") or 0) // j.data.world_size
        key = (
            str(p.get("mode")),
            str(p.get("backend")),
            str(local),
            str(p.get("batch")),
            str(p.get("dtype")),
        )
        per.setdefault(key, {})[j.data.world_size] = v.metrics["fwd_bwd_ms"].median
    found = []
    for key, sizes in per.items():
        ws = sorted(sizes)
        for a, b in itertools.pairwise(ws):
            found.append(
                {
                    "mode": key[0],
                    "backend": key[1],
                    "local": int(key[2]),
                    "from": a,
                    "to": b,
                    "before": sizes[a],
                    "after": sizes[b],
                    "growth": cv.growth(sizes[a], sizes[b]),
                }
            )
    if not found:
        return None, []
    found.sort(key=lambda r: (r["from"], r["to"], r["local"], r["mode"]))
    rows = [
        [
            f"CP{r['from']} → CP{r['to']}",
            _length(r["local"]),
            r["mode"],
            r["backend"],
            _ms(r["before"]),
            _ms(r["after"]),
            cv.percent(r["growth"], signed=True),
        ]
        for r in found
    ]
    head = (
        "Weak scaling: the same local length per rank on more ranks; growth = (after − before) / before "
        "of the fwd+bwd median (ms)."
    )
    header = ["world sizes", "local T", "mode", "backend", "fwd+bwd before", "fwd+bwd after", "growth"]
    return Section("cp-scaling", "CP weak scaling", [head, Table(header, rows)]), found


def _traj_prefix(metrics: Mapping[str, Any]) -> str | None:
    return next(
        (p for p in ("bf16", "fp32") if f"{p}_loss_max_rel" in metrics or f"{p}_loss_rel_err" in metrics),
        None,
    )


def _traj_cells(metrics: Mapping[str, Any], prefix: str, what: str) -> list[str]:
    ref = metrics.get(f"ref_{what}")
    rng = f"[{fmt(ref.min)}, {fmt(ref.max)}]" if ref is not None else "–"
    max_abs = metrics.get(f"{prefix}_{what}_max_abs") or metrics.get(f"{prefix}_{what}_abs_err")
    max_rel = metrics.get(f"{prefix}_{what}_max_rel") or metrics.get(f"{prefix}_{what}_rel_err")
    per_step = metrics.get(f"{prefix}_{what}_rel_err")
    return [
        rng,
        _err(_worst(max_abs)),
        _err(_worst(max_rel)) + _mark(max_rel, _worst(max_rel)),
        _err(None if per_step is None else per_step.mean),
    ]


def trajectories(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    rows_in = [(j, v) for j, v in _rows_of(jobs, "network") if v.params.get("kind") == "trajectory"
               and _traj_prefix(v.metrics)]
    if not rows_in:
        return None
    rows = []
    for j, v in sorted(
        rows_in,
        key=lambda r: (
            r[0].data.world_size,
            _layers(r[1].params.get("model")),
            str(r[1].params.get("mode")),
            str(r[1].params.get("checkpoint")),
        ),
    ):
        prefix = _traj_prefix(v.metrics)
        assert prefix is not None
        steps = v.metrics.get("ref_loss") or v.metrics.get(f"{prefix}_loss_rel_err")
        cells = [
            f"CP{j.data.world_size}",
            _layers(v.params.get("model")),
            link(
                f"{v.params.get('mode')}, ckpt {v.params.get('checkpoint')}",
                links.case(j.data.job_id, v.case.fingerprint),
            ),
            str(steps.count if steps else "–"),
        ]
        cells += _traj_cells(v.metrics, prefix, "loss") + _traj_cells(v.metrics, prefix, "grad_norm")
        rows.append(cells)
    header = [
        "topology",
        "layers",
        "mode",
        "steps",
        "loss ref range",
        "loss max abs",
        "loss max rel",
        "loss mean rel",
        "grad-norm ref range",
        "grad-norm max abs",
        "grad-norm max rel",
        "grad-norm mean rel",
    ]
    head = (
        "Candidate against the reference per optimizer step: the reference's range [min, max], the largest "
        "absolute and relative differences (possibly at different steps) and the mean relative difference."
    )
    return Section("trajectories", "Network trajectories", [head, Table(header, rows)])


def _speed_rows(jobs: Sequence[CampaignJob]) -> list[tuple[CampaignJob, Variant]]:
    return [(j, v) for j, v in _rows_of(jobs, "network") if v.params.get("kind") == "speed"
            and "fwd_bwd_ms" in v.metrics]


def network_speed(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    rows_all = _speed_rows(jobs)
    rows_in = [(j, v) for j, v in rows_all if v.params.get("checkpoint", "off") == "off"] or rows_all
    if not rows_in:
        return None
    gains = _gain_against(rows_in, "fwd_bwd_ms")
    rows = []
    for j, v in sorted(
        rows_in,
        key=lambda r: (
            _layers(r[1].params.get("model")),
            r[0].data.world_size,
            r[1].params.get("seq_len") or 0,
            str(r[1].params.get("mode")),
        ),
    ):
        T, ws = v.params.get("seq_len"), j.data.world_size
        local = _length(T // ws) if isinstance(T, int) and ws else "–"
        cells = [
            _layers(v.params.get("model")),
            f"CP{ws}",
            f"{_length(T)}/{local}",
            link(str(v.params.get("mode")), links.case(j.data.job_id, v.case.fingerprint)),
        ]
        rows.append(cells + _cp_timing_cells(j, v, gains, [_ms(_median(v.metrics.get("step_ms")))]))
    counts = _counts([v for _, v in rows_in], ("warmup", "repeat"))
    head = (
        f"Whole network, activation checkpoint off; times in ms ({counts}): median, p90 and min of the "
        "slowest rank per repetition; step = zero_grad + forward + loss + backward + reduce + optimizer "
        "step; gain = time saved against Ulysses, (U − P) / U of the fwd+bwd medians."
    )
    header = [
        "layers",
        "topology",
        "global/local T",
        "mode",
        *TIMING_HEADER,
        "step",
        "peak allocated",
        "peak reserved",
        "gain vs Ulysses",
    ]
    return Section("network-speed", "Network speed and memory", [head, Table(header, rows)])


def checkpoint(jobs: Sequence[CampaignJob], links: Links) -> tuple[Section | None, list[dict[str, Any]]]:
    rows_all = _speed_rows(jobs)
    by = {
        (j.data.job_id, _shape_key(v, ("checkpoint",)), v.params.get("checkpoint")): (j, v)
        for j, v in rows_all
    }
    found = []
    for (job_id, shape, ck), (j, v) in by.items():
        if ck != "off" or (job_id, shape, "full") not in by:
            continue
        full = by[(job_id, shape, "full")][1]
        tracked = cv.memory_tracked(j.data.device)
        pa, pb = v.metrics.get("peak_allocated_bytes"), full.metrics.get("peak_allocated_bytes")
        peak = cv.growth(_worst(pa), _worst(pb)) if tracked and pa is not None and pb is not None else None
        found.append(
            {
                "job": j,
                "off": v,
                "full": full,
                "mode": v.params.get("mode"),
                "time": cv.growth(v.metrics["fwd_bwd_ms"].median, full.metrics["fwd_bwd_ms"].median),
                "peak": peak,
                "tracked": tracked,
            }
        )
    if not found:
        return None, []
    offs = [(r["job"], r["off"]) for r in found]
    fulls = [(r["job"], r["full"]) for r in found]
    g_off, g_full = _gain_against(offs, "fwd_bwd_ms"), _gain_against(fulls, "fwd_bwd_ms")
    rows = []
    for r in sorted(found, key=lambda r: (_layers(r["off"].params.get("model")), r["job"].data.world_size,
                                          str(r["mode"]))):
        j, off, full = r["job"], r["off"], r["full"]
        rows.append(
            [
                _layers(off.params.get("model")),
                f"CP{j.data.world_size}",
                link(str(r["mode"]), links.case(j.data.job_id, off.case.fingerprint)),
                _ms(off.metrics["fwd_bwd_ms"].median),
                _ms(full.metrics["fwd_bwd_ms"].median),
                cv.percent(r["time"], signed=True),
                cv.percent(r["peak"], signed=True) if r["tracked"] else cv.NOT_TRACKED,
                g_off.get(id(off), "–"),
                g_full.get(id(full), "–"),
            ]
        )
    header = [
        "layers",
        "topology",
        "mode",
        "fwd+bwd off",
        "fwd+bwd full",
        "time",
        "peak allocated",
        "gain vs Ulysses off",
        "gain vs Ulysses full",
    ]
    head = (
        "Activation checkpoint off against full (each decoder layer): change = (full − off) / off of the "
        "fwd+bwd median (ms) and of the peak allocated."
    )
    return Section("checkpoint", "Activation checkpoint off vs full", [head, Table(header, rows)]), found


def determinism(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    rows = []
    for j, v in _rows_of(jobs, "network"):
        if v.params.get("kind") != "determinism":
            continue
        ms = v.metrics

        def same(name: str, ms: Mapping[str, Any] = ms) -> str:
            m = ms.get(name)
            return "–" if m is None else ("yes" if m.worst == 1.0 else "NO ✗")

        diff = ms.get("det_max_param_diff")
        rows.append(
            [
                f"CP{j.data.world_size}",
                link(str(v.params.get("mode")), links.case(j.data.job_id, v.case.fingerprint)),
                str(v.params.get("determinism_steps", "–")),
                same("det_loss_identical"),
                same("det_grad_norm_identical"),
                same("det_params_identical"),
                _err(_worst(diff)) + _mark(diff, _worst(diff)),
            ]
        )
    if not rows:
        return None
    head = (
        "Deterministic collectives and algorithms: checkpoint off and full must give bit-identical "
        "results step by step."
    )
    header = [
        "topology",
        "mode",
        "steps",
        "loss identical",
        "grad-norm identical",
        "params identical",
        "max param diff",
    ]
    return Section("determinism", "Deterministic pair", [head, Table(header, rows)])


def stability(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    rows = []
    for j, v in _rows_of(jobs, "stability"):
        ms, tracked = v.metrics, cv.memory_tracked(j.data.device)
        passes, finite, order = ms.get("passes_done"), ms.get("finite"), ms.get("order_checks")
        growth = ms.get("memory_growth_bytes")
        rows.append([f"CP{j.data.world_size}", link(str(v.params.get("mode", v.case.name)),
                     links.case(j.data.job_id, v.case.fingerprint)),
                     "–" if passes is None else f"{passes.worst:.0f}",
                     "–" if finite is None else ("yes" if finite.worst == 1.0 else "NO ✗"),
                     "–" if order is None else f"{order.worst:.0f}", _ms(_median(ms.get("pass_ms"))),
                     _memory(growth, tracked) + _mark(growth, _worst(growth) if tracked else None),
                     "error: " + (v.case.error or "").strip().splitlines()[-1][:120] if v.case.error else
                     (v.case.status or "–")])
    if not rows:
        return None
    header = [
        "topology",
        "mode",
        "passes",
        "all finite",
        "order checks",
        "pass median (ms)",
        "memory growth",
        "outcome",
    ]
    return Section("stability", "Stability", [Table(header, rows)])


def traces(jobs: Sequence[CampaignJob], links: Links) -> Section | None:
    lines: list[str | Table] = []
    for j in _suite_jobs(jobs, "profile"):
        for c in j.data.cases:
            stem = c.name.replace("/", "-")
            names = sorted(a for a in j.artifacts if stem in a)
            mode = (c.params or {}).get("mode", c.name)
            events = c.metrics.get("trace_events")
            size = f", {events.worst:.0f} events" if events is not None else ""
            if names:
                lines.append(
                    f"- CP{j.data.world_size} {mode}: "
                    f"{link(names[0], links.artifact(j.data.job_id, names[0]))}{size}"
                )
            else:
                lines.append(f"- CP{j.data.world_size} {mode}: no trace stored ({c.status or 'no result'})")
    if not lines:
        return None
    return Section(
        "traces", "Profile traces", ["One forward+backward per mode, not part of the timings.", *lines]
    )


def comparisons(cmps: Sequence[Any], links: Links) -> Section | None:
    if not cmps:
        return None
    rows = []
    for c in cmps:
        counts = ", ".join(f"{n} {v}" for v, n in c.counts().items() if n) or "no cases"
        rows.append(
            [
                c.suite,
                link(f"#{c.head.job_id}", links.job(c.head.job_id)),
                link(f"#{c.base.job_id}", links.job(c.base.job_id)),
                "pass" if c.passed else "FAIL",
                counts,
            ]
        )
    return Section(
        "base",
        "Against the base campaign",
        [Table(["suite", "head job", "base job", "verdict", "cases"], rows)],
    )


# --------------------------------------------------------------------------------- conclusions


def _worst_rel(
    rows: Iterable[tuple[CampaignJob, Variant]], tensors: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    out = []
    for j, v in rows:
        for t, label in tensors:
            m = v.metrics.get(f"{t}_rel_l2")
            if m is not None:
                out.append(
                    {
                        "value": m.worst,
                        "tensor": label,
                        "T": v.params.get("seq_len"),
                        "v": v,
                        "job": j,
                        "bound": m.bound,
                    }
                )
    return out


def _growth_with_t(found: Sequence[dict[str, Any]]) -> str | None:
    by_t: dict[int, float] = {}
    for r in found:
        if isinstance(r["T"], int) and r["value"] == r["value"]:
            by_t[r["T"]] = max(by_t.get(r["T"], 0.0), r["value"])
    if len(by_t) < 2:
        return None
    lo, hi = min(by_t), max(by_t)
    grows = by_t[hi] > GROWTH_FACTOR * by_t[lo]
    return (
        f"{'grows' if grows else 'does not grow'} with T (worst {fmt(by_t[lo])} at {_length(lo)}, "
        f"{fmt(by_t[hi])} at {_length(hi)}; grows means more than {GROWTH_FACTOR:g}× the shortest T's)"
    )


def _accuracy_conclusion(label: str, found: Sequence[dict[str, Any]]) -> str | None:
    if not found:
        return None
    nan = [r for r in found if r["value"] != r["value"]]
    if nan:
        first, where = nan[0], _length(nan[0]["T"])
        return f"{label}: {len(nan)} tensor(s) not finite (first: {first['tensor']} at T={where})."
    w = max(found, key=lambda r: r["value"])

    def where(r: dict[str, Any]) -> str:
        backend = r["v"].params.get("backend")
        return f"{r['tensor']}, " + (f"{backend} " if backend else "") + f"T={_length(r['T'])}"

    over = [r for r in found if r["bound"] is not None and r["value"] > r["bound"]]
    if over:
        first = max(over, key=lambda r: r["value"] / r["bound"] if r["bound"] else math.inf)
        held = (f"{len(over)} value(s) beyond their bound, the furthest {fmt(first['value'])} > "
                f"{fmt(first['bound'])} ({where(first)}): FAILS")
    else:
        held = (
            "every value within its metric's bound"
            if any(r["bound"] is not None for r in found)
            else "no bound"
        )
    own = f", bound {fmt(w['bound'])}" if w["bound"] is not None else ""
    extra = _growth_with_t(found)
    grows = f"; it {extra}" if extra else ""
    return f"{label}: worst relative-L2 {fmt(w['value'])} ({where(w)}{own}); {held}{grows}."


def _p2p_vs_ulysses(jobs: Sequence[CampaignJob]) -> str | None:
    rows = [(j, v) for j, v in _rows_of(jobs, "cp-layer") if v.params.get("mode") in ("p2p", BASE_MODE)]
    by = {(j.data.job_id, _shape_key(v, ("mode",))): v for j, v in rows if v.params.get("mode") == BASE_MODE}
    ratios: dict[str, list[float]] = {}
    for j, v in rows:
        u = by.get((j.data.job_id, _shape_key(v, ("mode",))))
        if v.params.get("mode") != "p2p" or u is None:
            continue
        for t, label in CP_TENSORS:
            a, b = v.metrics.get(f"{t}_rel_l2"), u.metrics.get(f"{t}_rel_l2")
            if a is None or b is None or a.worst != a.worst:
                continue
            wa, wb = a.worst, b.worst
            ratio = 1.0 if max(wa, wb) < ROUNDING_FLOOR else (wa / wb if wb > 0 else math.inf)
            ratios.setdefault(label, []).append(ratio)
    if not ratios:
        return None
    parts = [f"{t} {min(r):.2f}–{max(r):.2f}" for t, r in ratios.items()]
    same = all(1 / SAME_SIZE_FACTOR <= x <= SAME_SIZE_FACTOR for r in ratios.values() for x in r)
    return (
        f"CP layer, P2P against Ulysses (same shape, backend and dtype), P2P rel-L2 / Ulysses rel-L2 per "
        f"tensor (both below {ROUNDING_FLOOR:g} count as equal): "
        f"{'; '.join(parts)} — {'the same size' if same else 'NOT the same size'} (within "
        f"{SAME_SIZE_FACTOR:g}× either way)."
    )


def _gain_ranges(label: str, rows: Sequence[tuple[CampaignJob, Variant]], group: Any) -> list[str]:
    """Per group (world size, layers ...): the range of P2P's gain over Ulysses across its shapes."""
    gains: dict[str, list[tuple[float, str]]] = {}
    by = {(j.data.job_id, _shape_key(v, ("mode",))): v for j, v in rows if v.params.get("mode") == BASE_MODE}
    for j, v in rows:
        u = by.get((j.data.job_id, _shape_key(v, ("mode",))))
        if v.params.get("mode") != "p2p" or u is None:
            continue
        g = cv.gain(u.metrics["fwd_bwd_ms"].median, v.metrics["fwd_bwd_ms"].median)
        if g is not None:
            gains.setdefault(group(j, v), []).append((g, _length(v.params.get("seq_len"))))
    out = []
    for key, gs in sorted(gains.items()):
        lo, hi = min(gs), max(gs)
        word = "faster at every shape" if lo[0] > 0 else ("slower at every shape" if hi[0] < 0 else "mixed")
        span = (
            f"{cv.percent(lo[0])} ({lo[1]}) to {cv.percent(hi[0])} ({hi[1]})"
            if len(gs) > 1
            else f"{cv.percent(lo[0])} ({lo[1]})"
        )
        out.append(f"{label} {key}: P2P gain over Ulysses {span}; P2P {word}.")
    return out


def _failures(jobs: Sequence[CampaignJob]) -> list[str]:
    out = []
    for j in jobs:
        for view in views.case_views(j.data.cases):
            if view.status in ("passed", "expected error", "skipped"):
                continue
            why = (
                ", ".join(view.bad_metrics)
                or ((view.error or "").strip().splitlines() or [view.status])[-1][:160]
            )
            out.append(f"{j.data.suite} #{j.data.job_id} {view.name}: {view.status} ({why})")
        if j.data.status not in ("succeeded",) and j.data.error:
            out.append(
                f"{j.data.suite} #{j.data.job_id}: job {j.data.status} "
                f"({j.data.error.strip().splitlines()[-1][:160]})"
            )
    return out


def _span(values: Sequence[float]) -> str:
    """'+26.7% to +29.0%', or one value when they are all the same."""
    lo, hi = cv.percent(min(values), signed=True), cv.percent(max(values), signed=True)
    return lo if lo == hi else f"{lo} to {hi}"


def _peer_ratios(jobs: Sequence[CampaignJob], speeds: Sequence[tuple[CampaignJob, Variant]]) -> list[str]:
    """Each of the project's own backends against every other backend timed beside it (same job
    and shape, the baseline aside): the other's median / this one's for fwd+bwd and fwd, and the
    other's incremental peak / this one's; above 1 the own backend is faster or smaller."""
    own = {b["backend"] for j in jobs for b in views.backend_records(j.data.info)
           if b["distribution"] == "gdnval"}
    found: dict[tuple[str, str], list[tuple[int, str, str, str]]] = {}
    rows = {(j.data.job_id, _shape_key(v, ("backend",)), str(v.params.get("backend"))): v for j, v in speeds}
    for (job_id, shape, name), v in rows.items():
        base_name = str(v.params.get("baseline") or "eager")
        if name not in own or name == base_name:
            continue
        for (other_job, other_shape, other), w in rows.items():
            if (other_job, other_shape) != (job_id, shape) or other in own or other == base_name:
                continue
            peaks = (w.metrics.get("peak_bytes"), v.metrics.get("peak_bytes"))
            found.setdefault((name, other), []).append((
                int(v.params.get("seq_len") or 0),
                cv.speedup_text(w.metrics["fwd_bwd_ms"].median, v.metrics["fwd_bwd_ms"].median),
                cv.speedup_text(_median(w.metrics.get("fwd_ms")), _median(v.metrics.get("fwd_ms"))),
                cv.speedup_text(*(None if p is None else p.worst for p in peaks)),
            ))
    out = []
    for (name, other), xs in sorted(found.items()):
        xs.sort()
        parts = [
            f"{label} " + ", ".join(f"{x[i]} ({_length(x[0])})" for x in xs)
            for i, label in ((1, "fwd+bwd"), (2, "fwd"), (3, "incremental peak"))
            if any(x[i] != "–" for x in xs)
        ]
        out.append(f"Single-device {name} against {other} ({other}'s median / {name}'s; above 1× {name} "
                   f"is faster or smaller): {'; '.join(parts)}.")
    return out


def conclusions(
    jobs: Sequence[CampaignJob], scaling: Sequence[dict[str, Any]], ckpt: Sequence[dict[str, Any]]
) -> Section | None:
    items: list[str] = []
    gdn = _worst_rel(_rows_of(jobs, "gdn-op"), GDN_TENSORS)
    if (line := _accuracy_conclusion("Single-device GDN", gdn)) is not None:
        items.append(line)
    speeds = [(j, v) for j, v in _rows_of(jobs, "gdn-op") if "fwd_bwd_ms" in v.metrics
              and v.metrics["fwd_bwd_ms"].unit == "ms"]
    by = {(j.data.job_id, _shape_key(v, ("backend",)), v.params.get("backend")): v for j, v in speeds}
    ups: dict[str, list[tuple[float, str]]] = {}
    for j, v in speeds:
        base_name = str(v.params.get("baseline") or "eager")
        base = by.get((j.data.job_id, _shape_key(v, ("backend",)), base_name))
        s = (
            None
            if base is None or base is v
            else cv.speedup(base.metrics["fwd_bwd_ms"].median, v.metrics["fwd_bwd_ms"].median)
        )
        if s is not None:
            ups.setdefault(f"{v.params.get('backend')} vs {base_name}", []).append(
                (s, _length(v.params.get("seq_len")))
            )
    for pair, xs in sorted(ups.items()):
        lo, hi = min(xs), max(xs)
        items.append(
            f"Single-device speed-up {pair} (median fwd+bwd): {lo[0]:.2f}× ({lo[1]}) to {hi[0]:.2f}× "
            f"({hi[1]})."
        )
    items += _peer_ratios(jobs, speeds)
    cp = _worst_rel([(j, v) for j, v in _rows_of(jobs, "cp-layer") if not v.params.get("shards")], CP_TENSORS)
    if (line := _accuracy_conclusion("CP layer", cp)) is not None:
        items.append(line)
    if (line := _p2p_vs_ulysses(jobs)) is not None:
        items.append(line)
    pads = [v for _, v in _rows_of(jobs, "cp-layer") if _padded(v)]
    if pads:
        zero = sum(v.metrics["padding_output_max_abs"].worst == 0.0 for v in pads)
        items.append(f"Padding output exactly 0 in {zero} of {len(pads)} padding case(s).")
    layer_rows = [(j, v) for j, v in _rows_of(jobs, "cp-layer") if "fwd_bwd_ms" in v.metrics]
    dtypes = len({v.params.get("dtype") for _, v in layer_rows}) > 1
    items += _gain_ranges(
        "CP layer", layer_rows,
        lambda j, v: f"CP{j.data.world_size} {_padding(v)}" + (f" {v.params.get('dtype')}" if dtypes else ""),
    )
    net_rows = [(j, v) for j, v in _speed_rows(jobs) if v.params.get("checkpoint", "off") == "off"]
    items += _gain_ranges(
        "Network", net_rows, lambda j, v: f"CP{j.data.world_size}, {_layers(v.params.get('model'))} layers"
    )
    by_local: dict[tuple[int, int, int], dict[str, float]] = {}
    for r in scaling:
        if r["growth"] is not None:
            by_local.setdefault((r["from"], r["to"], r["local"]), {})[r["mode"]] = r["growth"]
    for (a, b, local), modes in sorted(by_local.items()):
        text = ", ".join(f"{m} {cv.percent(g, signed=True)}" for m, g in sorted(modes.items()))
        verdict = ""
        if "p2p" in modes and BASE_MODE in modes:
            verdict = (
                "; P2P scales better than Ulysses"
                if modes["p2p"] < modes[BASE_MODE]
                else "; P2P does not scale better than Ulysses"
            )
        items.append(f"Weak scaling CP{a} → CP{b} at local {_length(local)}: fwd+bwd growth {text}{verdict}.")
    if ckpt:
        times = [r["time"] for r in ckpt if r["time"] is not None]
        peaks = [r["peak"] for r in ckpt if r["peak"] is not None]
        time_text = f"fwd+bwd {_span(times)}" if times else "fwd+bwd –"
        peak_text = f"peak allocated {_span(peaks)}" if peaks else "peak allocated not tracked"
        text = f"Activation checkpoint full vs off (change = (full − off) / off): {time_text}, {peak_text}"
        items.append(text + ".")
    traj = [(j, v) for j, v in _rows_of(jobs, "network") if v.params.get("kind") == "trajectory"
            and _traj_prefix(v.metrics)]
    for what, label in (("loss", "loss"), ("grad_norm", "grad-norm")):
        found = []
        for _j, v in traj:
            prefix = _traj_prefix(v.metrics)
            m = v.metrics.get(f"{prefix}_{what}_max_rel") or v.metrics.get(f"{prefix}_{what}_rel_err")
            if m is not None:
                found.append((m.worst, m, v))
        if found:
            worst_v, m, v = max(found, key=lambda x: math.inf if x[0] != x[0] else x[0])
            holds = (
                ""
                if m.bound is None
                else (
                    " within its bound " if views.judge(worst_v, m).state != "bad" else " OUTSIDE its bound "
                )
                + fmt(m.bound)
            )
            items.append(
                f"Network trajectories: worst {label} max relative difference {fmt(worst_v)} "
                f"({v.params.get('mode')}, ckpt {v.params.get('checkpoint')}){holds}."
            )
    fails = _failures(jobs)
    if not fails:
        items.append("Every bound holds; no case errored.")
    else:
        more = f" (the first {MAX_NAMED_FAILURES} named)" if len(fails) > MAX_NAMED_FAILURES else ""
        items.append(f"{len(fails)} case(s) failed a bound or errored{more}:")
        items += [f"Failed: {f}." for f in fails[:MAX_NAMED_FAILURES]]
    return Section(
        "conclusions",
        "Conclusions",
        ["Each line follows from the tables above by the rule it states.", *(f"- {x}" for x in items)],
    )


def build_sections(
    jobs: Sequence[CampaignJob], cmps: Sequence[Any] = (), links: Links | None = None
) -> list[Section]:
    """The report's sections in the hand-written report's order; those without data left out."""
    links = links or Links()
    scaling_section, scaling = cp_scaling(jobs, links)
    ckpt_section, ckpt = checkpoint(jobs, links)
    out = [
        environment(jobs, links),
        capability(jobs, links),
        gdn_accuracy(jobs, links),
        gdn_speed(jobs, links),
        cp_accuracy(jobs, links),
        cp_speed(jobs, links),
        scaling_section,
        trajectories(jobs, links),
        network_speed(jobs, links),
        ckpt_section,
        determinism(jobs, links),
        stability(jobs, links),
        traces(jobs, links),
        comparisons(cmps, links),
        conclusions(jobs, scaling, ckpt) if jobs else None,
    ]
    for s in out:
        if s is not None:
            s.blocks = [b.without_empty_columns() if isinstance(b, Table) and b.rows else b for b in s.blocks]
    return [s for s in out if s is not None]


# ------------------------------------------------------------------------------------ plots


@dataclass
class Series:
    """One line of a plot: values (and their spread) at each size."""

    name: str
    sizes: list[float]
    values: list[float]
    lo: list[float]
    hi: list[float]


@dataclass
class Sweep:
    """A statistic against a size (sequence length, world size), one series per backend or mode."""

    key: str
    title: str
    x_label: str
    unit: str
    series: list[Series]


def _sweep_of(key: str, title: str, x_label: str, points: Iterable[tuple[str, float, Any]]) -> Sweep | None:
    """(series name, size, fwd+bwd metric) points as a sweep of medians with min..p90 whiskers."""
    by: dict[str, dict[float, Any]] = {}
    for name, size, m in points:
        by.setdefault(name, {})[size] = m
    series = []
    for name, at in sorted(by.items()):
        sizes = sorted(at)
        series.append(Series(name, sizes, [at[x].median for x in sizes], [at[x].min for x in sizes],
                             [at[x].p90 for x in sizes]))
    return Sweep(key, title, x_label, "ms", series) if series else None


def sweeps(jobs: Sequence[CampaignJob]) -> list[Sweep]:
    """The report's plots as plain data: time against length per backend (single device) and per
    topology and mode (CP layer), time against world size per mode at a fixed local length."""
    gdn = [
        (f"{v.params.get('backend')}" + (f" {v.params['mode']}" if v.params.get("mode") else ""),
         float(v.params["seq_len"]), v.metrics["fwd_bwd_ms"])
        for _, v in _rows_of(jobs, "gdn-op")
        if "fwd_bwd_ms" in v.metrics and v.metrics["fwd_bwd_ms"].unit == "ms" and v.params.get("seq_len")
    ]
    cp_rows = [
        (j, v)
        for j, v in _rows_of(jobs, "cp-layer")
        if "fwd_bwd_ms" in v.metrics and v.params.get("seq_len") and v.params.get("valid_len") is None
        and not v.params.get("packed")
    ]
    dtypes = len({v.params.get("dtype") for _, v in cp_rows}) > 1
    cp = [
        (f"{_cp_label(j, v)} {v.params.get('mode')}" + (f" {v.params.get('dtype')}" if dtypes else ""),
         float(v.params["seq_len"]), v.metrics["fwd_bwd_ms"])
        for j, v in cp_rows
    ]
    _, found = cp_scaling(jobs, Links())
    scaling = []
    for r in found:
        name = f"{r['mode']} local {_length(r['local'])}"
        scaling += [(name, float(r["from"]), _Point(r["before"])), (name, float(r["to"]), _Point(r["after"]))]
    out = [
        _sweep_of("gdn-time", "Single-device fwd+bwd against T", "sequence length", gdn),
        _sweep_of("cp-time", "CP layer fwd+bwd against global T", "global sequence length", cp),
        _sweep_of("cp-scaling", "CP layer weak scaling: fwd+bwd against world size", "world size", scaling),
    ]
    return [s for s in out if s is not None]


@dataclass(frozen=True)
class _Point:
    """A median alone (weak scaling keeps only the medians it compares)."""

    median: float

    @property
    def min(self) -> float:
        return self.median

    @property
    def p90(self) -> float:
        return self.median
