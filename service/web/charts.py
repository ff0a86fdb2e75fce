"""Server-side SVG charts: pure Python, no JavaScript, no CDN, no torch.

Why server-side SVG: the pages must work offline and render fast for jobs with 100k samples, so
a chart never draws more marks than a reader can see. Above `MAX_POINTS` values a lane is binned
(a histogram strip) and the counts are printed beside it; trajectories above `MAX_STEPS` steps are
reduced to the worst value per bin of steps. Every chart carries an accessible `<title>` and a
`<desc>` that states the numbers in words, and marks carry their own `<title>` as a tooltip.

Marks a test can count carry a class: `rep` (one repetition), `bin` (one histogram bin),
`box` (one box), `point` (one commit), `step` (one trajectory vertex), `spark` (a sparkline).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np
from markupsafe import Markup

from service.presentation.numbers import fmt
from workers.stats import quantiles

MAX_POINTS = 400  # per lane: above this, a lane is drawn as a histogram of BINS bins
BINS = 48
MAX_STEPS = 400  # trajectory vertices per series before binning steps
# Colour-blind safe palette (Okabe-Ito); ranks and series are also told apart by lane and label.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
_ids = itertools.count()


def _uid(prefix: str) -> str:
    return f"{prefix}{next(_ids)}"


def _svg(width: int, height: int, title: str, desc: str, body: list[str], css: str = "chart") -> Markup:
    uid = _uid("c")
    return Markup(
        f'<svg class="{css}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-labelledby="{uid}t {uid}d" xmlns="http://www.w3.org/2000/svg">'
        f'<title id="{uid}t">{escape(title)}</title><desc id="{uid}d">{escape(desc)}</desc>'
        + "".join(body)
        + "</svg>"
    )


def _text(x: float, y: float, s: str, anchor: str = "start", css: str = "lbl") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{css}">{escape(s)}</text>'


@dataclass(frozen=True)
class Scale:
    """Maps data values to pixels, linear or log10 (log when values span > 2 decades and are > 0)."""

    lo: float
    hi: float
    p0: float
    p1: float
    log: bool = False

    @classmethod
    def fit(cls, values: np.ndarray, p0: float, p1: float, *, allow_log: bool = False,
            include: Sequence[float] = ()) -> Scale:
        v = np.asarray(values, dtype=float)
        v = v[np.isfinite(v)]
        if include:
            v = np.concatenate([v, np.asarray(include, dtype=float)])
        if v.size == 0:
            return cls(0.0, 1.0, p0, p1)
        lo, hi = float(v.min()), float(v.max())
        positive = v[v > 0]
        if allow_log and lo >= 0 and positive.size and hi / float(positive.min()) > 100:
            # errors span decades: log scale; exact zeros sit on the bottom edge
            lo_pos = float(positive.min())
            return cls(math.floor(math.log10(lo_pos) * 4) / 4, math.log10(hi) + 0.05, p0, p1, log=True)
        if hi == lo:
            pad = abs(hi) * 0.05 or 1.0
            lo, hi = lo - pad, hi + pad
        pad = (hi - lo) * 0.04
        return cls(lo - pad, hi + pad, p0, p1)

    def __call__(self, value: float) -> float:
        if self.log:
            value = math.log10(value) if value > 0 else self.lo
        if not math.isfinite(value):
            return self.p1
        return self.p0 + (value - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)

    def array(self, values: np.ndarray) -> np.ndarray:
        """Vectorised __call__: pixels for many values at once (non-finite -> the far end)."""
        v = np.asarray(values, dtype=np.float64)
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), self.lo)
        out = self.p0 + (v - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)
        return np.where(np.isfinite(out), out, self.p1)

    def ticks(self, n: int = 4) -> list[float]:
        if self.log:
            return [10.0**e for e in range(math.floor(self.lo), math.ceil(self.hi) + 1)
                    if self.lo - 1e-9 <= e <= self.hi + 1e-9]
        raw = (self.hi - self.lo) / max(n, 1)
        mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
        step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
        first = math.ceil(self.lo / step) * step
        return [first + i * step for i in range(int((self.hi - first) / step) + 1)]


_QS = np.array([0.0, 0.25, 0.5, 0.75, 0.9, 1.0])


def _quantiles(v: np.ndarray) -> tuple[float, float, float, float, float, float]:
    """min, p25, median, p75, p90, max of the finite values (`workers.stats.quantiles`)."""
    return tuple(quantiles(v, _QS))  # type: ignore[return-value]


@dataclass(frozen=True)
class Lane:
    """Every repetition of one metric on one rank (idx order)."""

    metric: str
    rank: int
    values: Sequence[float] | np.ndarray


def timing_distribution(
    lanes: Sequence[Lane],
    worst: Mapping[str, Sequence[float] | np.ndarray],
    *,
    unit: str = "ms",
    title: str = "Timing distribution",
    width: int = 640,
) -> Markup:
    """A block per metric, each on its own axis: one lane per rank (every repetition a dot) and a
    box over the worst-rank values (box p25–p75, median line, whiskers min–max, p90 tick), so both
    the spread across repetitions and the slowest rank are visible. Lanes with more than
    MAX_POINTS values are drawn as histogram bins with their count printed."""
    metrics = list(dict.fromkeys([lane.metric for lane in lanes] + list(worst)))
    by_key = {(lane.metric, lane.rank): np.asarray(lane.values, dtype=float) for lane in lanes}
    left, right, top, box_h, gap = 44, 16, 4, 14, 10
    body: list[str] = []
    desc: list[str] = []
    y = float(top)
    for metric in metrics:
        ranks = sorted(r for (m, r) in by_key if m == metric)
        lane_h = 9.0 if len(ranks) <= 16 else max(2.0, 144 / len(ranks))
        w = np.asarray(worst.get(metric, []), dtype=float)
        w = w[np.isfinite(w)]
        vals_all = [by_key[(metric, r)] for r in ranks] + [w]
        x = Scale.fit(np.concatenate(vals_all) if vals_all else np.empty(0), left, width - right)
        head = metric
        stats = _quantiles(w) if w.size else None
        if stats is not None:
            head += f": median {fmt(stats[2], unit)}, p90 {fmt(stats[4], unit)}"
        body.append(_text(4, y + 11, head, css="lbl strong"))
        y += 16
        block_top = y
        block_h = lane_h * len(ranks) + (box_h if w.size else 0)
        ticks = x.ticks(5)
        for t in ticks:
            body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{block_top:.1f}" '
                        f'y2="{block_top + block_h:.1f}" class="grid"/>')
        for rank in ranks:
            vals = by_key[(metric, rank)]
            color = PALETTE[rank % len(PALETTE)]
            cy = y + lane_h / 2
            if 1 < len(ranks) <= 16:
                body.append(_text(left - 6, cy + 3, f"r{rank}", anchor="end", css="lbl small"))
            fin = vals[np.isfinite(vals)]
            if fin.size > MAX_POINTS:
                counts, edges = np.histogram(fin, bins=BINS)
                peak = max(int(counts.max()), 1)
                for c, e0, e1 in zip(counts, edges[:-1], edges[1:], strict=True):
                    if c == 0:
                        continue
                    h = max(1.0, (lane_h - 1) * c / peak)
                    x0, x1 = x(float(e0)), x(float(e1))
                    body.append(
                        f'<rect class="bin" x="{x0:.1f}" y="{cy + lane_h / 2 - h:.1f}" '
                        f'width="{max(x1 - x0, 0.8):.1f}" height="{h:.1f}" fill="{color}">'
                        f"<title>rank {rank}: {c} of {fin.size} in {fmt(float(e0))}–{fmt(float(e1), unit)}"
                        "</title></rect>"
                    )
                if len(ranks) <= 16 or rank == ranks[0]:
                    body.append(_text(width - right, cy + 3, f"n={fin.size} binned", anchor="end",
                                      css="lbl small"))
            else:
                i = np.flatnonzero(np.isfinite(vals))
                cx = x.array(vals[i]).tolist()
                cys = (cy + ((i * 7919) % 5 - 2) * lane_h / 10).tolist()
                body.append(f'<g fill="{color}" fill-opacity="0.6">')
                body.extend(
                    f'<circle class="rep" cx="{a:.1f}" cy="{b:.1f}" r="2.2"><title>rank {rank} rep {n}: '
                    f"{v:.4g} {unit}</title></circle>"
                    for a, b, n, v in zip(cx, cys, i.tolist(), vals[i].tolist(), strict=True)
                )
                body.append("</g>")
            y += lane_h
        if stats is not None:
            mn, q1, med, q3, p90, mx = stats
            cy = y + box_h / 2
            body.append(_text(left - 6, cy + 3, "worst" if len(ranks) > 1 else "box", anchor="end",
                              css="lbl small"))
            body.append(
                f'<g class="box"><title>{escape(metric)} (worst rank per repetition, n={w.size}): '
                f"min {fmt(mn, unit)}, median {fmt(med, unit)}, p90 {fmt(p90, unit)}, max {fmt(mx, unit)}"
                "</title>"
                f'<line x1="{x(mn):.1f}" x2="{x(mx):.1f}" y1="{cy:.1f}" y2="{cy:.1f}" class="whisker"/>'
                f'<rect x="{x(q1):.1f}" y="{cy - box_h / 2 + 2:.1f}" width="{max(x(q3) - x(q1), 1):.1f}" '
                f'height="{box_h - 4}" class="iqr"/>'
                f'<line x1="{x(med):.1f}" x2="{x(med):.1f}" y1="{cy - box_h / 2 + 1:.1f}" '
                f'y2="{cy + box_h / 2 - 1:.1f}" class="median"/>'
                f'<line x1="{x(p90):.1f}" x2="{x(p90):.1f}" y1="{cy - 3:.1f}" y2="{cy + 3:.1f}" class="p90"/>'
                "</g>"
            )
            desc.append(f"{metric}: median {fmt(med, unit)}, p90 {fmt(p90, unit)}, min {fmt(mn, unit)}"
                        f" over {w.size} repetitions and {len(ranks)} rank(s)")
            y += box_h
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="axis"/>')
        for t in ticks:
            body.append(_text(x(t), y + 12, fmt(t), anchor="middle", css="lbl small"))
        body.append(_text(left - 6, y + 12, unit, anchor="end", css="lbl small"))
        y += 14 + gap
    return _svg(width, int(y), title, "; ".join(desc) or "no finite samples", body)


@dataclass(frozen=True)
class SeriesPoint:
    """One commit of a history: the median with its spread (e.g. min..p90) and sample count."""

    label: str
    median: float | None
    lo: float | None
    hi: float | None
    n: int = 0
    href: str | None = None


def history_line(points: Sequence[SeriesPoint], *, unit: str = "", title: str = "History",
                 bound: float | None = None, width: int = 640, height: int = 220) -> Markup:
    """The median per commit joined by a line, the spread as a band, one dot (linked to the job)
    per commit, and the bound as a dashed line: where did this number move?"""
    left, right, top, bottom = 64, 14, 10, 46
    vals = [v for p in points for v in (p.median, p.lo, p.hi) if v is not None and math.isfinite(v)]
    ys = Scale.fit(np.asarray(vals, dtype=float), height - bottom, top,
                   include=[bound] if bound is not None else ())
    n = len(points)
    step = (width - left - right) / max(n - 1, 1)

    def px(i: int) -> float:
        return left + (i * step if n > 1 else (width - left - right) / 2)

    body: list[str] = []
    for t in ys.ticks(4):
        py = ys(t)
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{py:.1f}" y2="{py:.1f}" class="grid"/>')
        body.append(_text(left - 6, py + 3, fmt(t), anchor="end", css="lbl small"))
    band = [(px(i), ys(p.hi)) for i, p in enumerate(points) if p.hi is not None and p.lo is not None]
    band += [(px(i), ys(p.lo)) for i, p in reversed(list(enumerate(points)))
             if p.hi is not None and p.lo is not None]
    if len(band) >= 4:
        body.append('<polygon class="band" points="' + " ".join(f"{a:.1f},{b:.1f}" for a, b in band) + '"/>')
    line = [(px(i), ys(p.median)) for i, p in enumerate(points) if p.median is not None]
    if len(line) >= 2:
        body.append('<polyline class="line" points="' + " ".join(f"{a:.1f},{b:.1f}" for a, b in line) + '"/>')
    if bound is not None:
        by = ys(bound)
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{by:.1f}" y2="{by:.1f}" class="bound"/>')
        body.append(_text(width - right, by - 3, f"bound {fmt(bound, unit)}", anchor="end", css="lbl small"))
    every = max(1, math.ceil(n / 12))
    for i, p in enumerate(points):
        if i % every == 0 or i == n - 1:
            tx, ty = px(i), height - bottom + 14
            body.append(f'<text x="{tx:.1f}" y="{ty}" text-anchor="end" class="lbl small" '
                        f'transform="rotate(-30 {tx:.1f} {ty})">{escape(p.label)}</text>')
        if p.median is None:
            continue
        tip = (f"{p.label}: median {fmt(p.median, unit)}, spread {fmt(p.lo)}–{fmt(p.hi, unit)}, "
               f"n={p.n}")
        dot = (f'<circle class="point" cx="{px(i):.1f}" cy="{ys(p.median):.1f}" r="3.5">'
               f"<title>{escape(tip)}</title></circle>")
        body.append(f'<a href="{escape(p.href)}">{dot}</a>' if p.href else dot)
    body.append(_text(4, top + 8, unit, css="lbl small"))
    meds = [p.median for p in points if p.median is not None]
    desc = (f"{n} commits; median from {fmt(meds[0], unit)} (first) to {fmt(meds[-1], unit)} (last), "
            f"range {fmt(min(meds), unit)}–{fmt(max(meds), unit)}") if meds else "no values"
    return _svg(width, height, title, desc, body)


def sparkline(values: Sequence[float | None], *, title: str, unit: str = "", width: int = 120,
              height: int = 26) -> Markup:
    """A small line of the last values of one series, the last point marked: the suite overview
    shows one per case so a moving number stands out. The scale spans at least ±5% of the mean."""
    pts = [(i, v) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if not pts:
        return _svg(width, height, title, "no values", [_text(2, height - 8, "no data", css="lbl small")],
                    css="spark")
    vals = np.asarray([v for _, v in pts])
    mid = float(np.mean(vals))
    # at least ±5% of the level: noise stays flat, a real move is steep (auto-scale would make
    # a 0.2% wobble look like a cliff)
    ys = Scale.fit(vals, height - 3, 3, include=[mid * 0.95, mid * 1.05] if mid else ())
    n = len(values)

    def px(i: int) -> float:
        return 2 + (i * (width - 6) / (n - 1) if n > 1 else (width - 4) / 2)

    body = ['<polyline class="line" points="' + " ".join(f"{px(i):.1f},{ys(v):.1f}" for i, v in pts) + '"/>']
    li, lv = pts[-1]
    body.append(f'<circle class="last" cx="{px(li):.1f}" cy="{ys(lv):.1f}" r="2"/>')
    vs = [v for _, v in pts]
    desc = (f"{len(pts)} values, first {fmt(vs[0], unit)}, last {fmt(vs[-1], unit)}, "
            f"min {fmt(min(vs))}, max {fmt(max(vs))}")
    return _svg(width, height, title, desc, body, css="spark")


@dataclass(frozen=True)
class Trajectory:
    """One per-step series (e.g. loss max-rel error): idx = step, value = error at that step."""

    name: str
    steps: Sequence[int] | np.ndarray
    values: Sequence[float] | np.ndarray
    bound: float | None = None
    per_bin: int = 1  # >1: each value is already the worst of this many steps (binned upstream)
    width: float = 1.5  # line width: a wider line drawn first stays visible under an equal one


def trajectory_chart(series: Sequence[Trajectory], *, title: str = "Error per step", unit: str = "",
                     width: int = 640, height: int = 220) -> Markup:
    """Error per optimizer step, one line per series (log scale when it spans decades), the bound
    dashed; over MAX_STEPS steps each vertex is the worst (max) value of its bin of steps."""
    extra = 14 * max(0, (len(series) - 1) // 3)  # more legend rows below the axis
    left, right, top, bottom = 64, 14, 10, 50 + extra
    height += extra
    prepared: list[tuple[Trajectory, np.ndarray, np.ndarray, int]] = []
    for s in series:
        st = np.asarray(s.steps, dtype=float)
        va = np.asarray(s.values, dtype=float)
        order = np.argsort(st, kind="stable")
        st, va = st[order], va[order]
        per_bin = s.per_bin
        if st.size > MAX_STEPS:
            per_bin *= math.ceil(st.size / MAX_STEPS)
            cut = st.size - st.size % per_bin
            head_s, head_v = st[:cut].reshape(-1, per_bin), va[:cut].reshape(-1, per_bin)
            st2, va2 = head_s[:, 0], np.nanmax(head_v, axis=1)
            if cut < st.size:
                st2 = np.append(st2, st[cut])
                va2 = np.append(va2, np.nanmax(va[cut:]))
            st, va = st2, va2
        prepared.append((s, st, va, per_bin))
    all_steps = np.concatenate([p[1] for p in prepared]) if prepared else np.empty(0)
    all_vals = np.concatenate([p[2] for p in prepared]) if prepared else np.empty(0)
    bounds = [s.bound for s in series if s.bound is not None]
    xs = Scale.fit(all_steps, left, width - right)
    ys = Scale.fit(all_vals, height - bottom, top, allow_log=True, include=bounds)
    body: list[str] = []
    for t in ys.ticks(4):
        py = ys(t)
        label = f"1e{round(math.log10(t))}" if ys.log else fmt(t)
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{py:.1f}" y2="{py:.1f}" class="grid"/>')
        body.append(_text(left - 6, py + 3, label, anchor="end", css="lbl small"))
    for t in xs.ticks(6):
        if t < 0:
            continue
        body.append(_text(xs(t), height - bottom + 14, f"{t:g}", anchor="middle", css="lbl small"))
    body.append(_text(width - right, height - bottom + 28, "step", anchor="end", css="lbl small"))
    desc: list[str] = []
    for i, (s, st, va, per_bin) in enumerate(prepared):
        color = PALETTE[i % len(PALETTE)]
        ok = np.isfinite(va)
        px, py = xs.array(st[ok]).tolist(), ys.array(va[ok]).tolist()
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py, strict=True))
        body.append(f'<polyline class="traj" stroke="{color}" style="stroke-width: {s.width:g}" '
                    f'points="{pts}"/>')
        marks = st.size <= 60
        for a, b in zip(st, va, strict=True):
            if not math.isfinite(b):
                body.append(f'<text class="nonfinite" x="{xs(float(a)):.1f}" y="{top + 8}" '
                            f'text-anchor="middle">✕<title>step {a:g}: not finite</title></text>')
            elif marks:
                body.append(f'<circle class="step" cx="{xs(float(a)):.1f}" cy="{ys(float(b)):.1f}" r="2" '
                            f'fill="{color}"><title>{escape(s.name)} step {a:g}: {fmt(float(b), unit)}'
                            "</title></circle>")
        if s.bound is not None:
            by = ys(s.bound)
            body.append(f'<line x1="{left}" x2="{width - right}" y1="{by:.1f}" y2="{by:.1f}" class="bound" '
                        f'style="stroke: {color}"><title>{escape(s.name)} bound {fmt(s.bound, unit)}</title>'
                        "</line>")
            body.append(_text(width - right, by - 3, f"bound {fmt(s.bound, unit)}", anchor="end",
                              css="lbl small"))
        # legend below the axis: a short line, the name, and the binning if any
        lx = left + (i % 3) * ((width - left) / 3)
        ly = height - bottom + 40 + (i // 3) * 14
        label = s.name + (f" (max per {per_bin} steps)" if per_bin > 1 else "")
        body.append(f'<line x1="{lx:.1f}" x2="{lx + 14:.1f}" y1="{ly - 3:.1f}" y2="{ly - 3:.1f}" '
                    f'stroke="{color}" class="legend"/>')
        body.append(_text(lx + 18, ly, label, css="lbl small"))
        fin = va[np.isfinite(va)]
        worst = fmt(float(fin.max()), unit) if fin.size else "none finite"
        desc.append(f"{s.name}: {np.asarray(s.steps).size} steps, worst {worst}"
                    + (f", bound {fmt(s.bound, unit)}" if s.bound is not None else ""))
    return _svg(width, height, title, "; ".join(desc) or "no steps", body)


@dataclass(frozen=True)
class SweepSeries:
    """One line of a sweep: a statistic (e.g. the median fwd+bwd time) at each size (e.g. T)."""

    name: str
    sizes: Sequence[float]
    values: Sequence[float]
    lo: Sequence[float] | None = None  # optional spread per size (e.g. min .. p90), drawn as a whisker
    hi: Sequence[float] | None = None


def _size_label(size: float) -> str:
    """8192 -> '8K', 1048576 -> '1M': sequence lengths as people write them."""
    for factor, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if size >= factor and size % factor == 0:
            return f"{int(size // factor)}{suffix}"
    return f"{size:g}"


def sweep_chart(series: Sequence[SweepSeries], *, title: str, x_label: str = "sequence length",
                unit: str = "", width: int = 640, height: int = 260) -> Markup:
    """A statistic against a size that doubles (sequence lengths), one line per series: the x axis
    is log2, ticked at every measured size; each point carries its value (and spread) as a tooltip."""
    extra = 14 * max(0, (len(series) - 1) // 3)
    left, right, top, bottom = 64, 14, 10, 50 + extra
    height += extra
    sizes = sorted({float(s) for ser in series for s in ser.sizes if s > 0})
    xs = Scale.fit(np.log2(np.asarray(sizes, dtype=float)) if sizes else np.empty(0), left, width - right)
    vals = [float(v) for ser in series for arr in (ser.values, ser.lo or (), ser.hi or ()) for v in arr]
    # from zero on a linear axis, unless the values span more than two decades (an eager baseline
    # beside fused kernels): then log10, so the fast lines do not lie flat on the axis
    ys = Scale.fit(np.asarray(vals, dtype=float), height - bottom, top, allow_log=True, include=[0.0])
    body: list[str] = []
    for t in ys.ticks(4):
        py = ys(t)
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{py:.1f}" y2="{py:.1f}" class="grid"/>')
        body.append(_text(left - 6, py + 3, fmt(t), anchor="end", css="lbl small"))
    if ys.log:
        body.append(_text(left, top + 8, "log scale", css="lbl small"))
    for s in sizes:
        body.append(_text(xs(math.log2(s)), height - bottom + 14, _size_label(s), anchor="middle",
                          css="lbl small"))
    body.append(_text(width - right, height - bottom + 28, x_label, anchor="end", css="lbl small"))
    body.append(_text(4, top + 8, unit, css="lbl small"))
    desc: list[str] = []
    for i, ser in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pairs = enumerate(zip(ser.sizes, ser.values, strict=True))
        pts = sorted((float(a), float(b), j) for j, (a, b) in pairs if a > 0 and math.isfinite(float(b)))
        line = " ".join(f"{xs(math.log2(a)):.1f},{ys(b):.1f}" for a, b, _ in pts)
        body.append(f'<polyline class="traj" stroke="{color}" points="{line}"/>')
        for a, b, j in pts:
            px = xs(math.log2(a))
            tip = f"{ser.name} at {_size_label(a)}: {fmt(b, unit)}"
            if ser.lo is not None and ser.hi is not None:
                lo, hi = float(ser.lo[j]), float(ser.hi[j])
                body.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{ys(lo):.1f}" y2="{ys(hi):.1f}" '
                            f'class="whisker" style="stroke: {color}"/>')
                tip += f" (spread {fmt(lo)}–{fmt(hi, unit)})"
            body.append(f'<circle class="point" cx="{px:.1f}" cy="{ys(b):.1f}" r="3" style="fill: {color}">'
                        f"<title>{escape(tip)}</title></circle>")
        lx = left + (i % 3) * ((width - left) / 3)
        ly = height - bottom + 40 + (i // 3) * 14
        body.append(f'<line x1="{lx:.1f}" x2="{lx + 14:.1f}" y1="{ly - 3:.1f}" y2="{ly - 3:.1f}" '
                    f'stroke="{color}" class="legend"/>')
        body.append(_text(lx + 18, ly, ser.name, css="lbl small"))
        desc.append(f"{ser.name}: " + ", ".join(f"{_size_label(a)} {fmt(b, unit)}" for a, b, _ in pts))
    return _svg(width, height, title, "; ".join(desc) or "no values", body)
