"""The report's cells and the comparisons behind them, shared by every suite's section.

Numbers follow one rule each (`service.presentation.conventions`); every comparison of two sets
of repetitions (a gain over Ulysses, a speed-up over the baseline backend, a growth from one
world size to the next, a checkpoint's overhead) is the judgment's (`service.domain.compare.
judgment.difference`) on the values after the worst-rank reduction, and its text says "no
significant difference" unless the interval supports a claim.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from service.domain.compare.judgment import Difference, difference
from service.presentation import conventions as cv
from service.presentation import views
from service.presentation.numbers import fmt
from service.presentation.report_model import Cell, Links, ReportJob
from service.presentation.report_tables import Variant, variants

BASE_MODE = "ulysses"
TIMING_HEADER = ["fwd", "fwd+bwd", "fwd+bwd p90", "fwd+bwd min", "bwd estimate"]


# ------------------------------------------------------------------------------------- numbers


def ms(value: float | None) -> str:
    """A time in ms as the report prints it: three decimals (160.283)."""
    if value is None or not math.isfinite(value):
        return "–" if value is None else fmt(value)
    return f"{value:.3f}"


def err(value: float | None) -> str:
    return "–" if value is None else fmt(value)


def worst(m: Any) -> float | None:
    return None if m is None else m.worst


def median(m: Any) -> float | None:
    return None if m is None else m.median


def length(value: Any) -> str:
    """8192 -> '8K'; other lengths as they are."""
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}K"
    return "–" if value is None else str(value)


def mark(m: Any, value: float | None) -> str:
    """' ✗' after a value that breaks its metric's bound (or is not finite), else ''."""
    if m is None or value is None:
        return ""
    return " ✗" if views.judge(value, m).state == "bad" else ""


def judged(m: Any) -> str:
    """A metric's worst value with its ✗ when out of bound."""
    return err(worst(m)) + mark(m, worst(m))


def memory(m: Any, tracked: bool) -> str:
    """A peak reading (max over ranks); "not tracked" on a device without allocator statistics."""
    if m is None:
        return "–" if tracked else cv.NOT_TRACKED
    return cv.memory_text(m.worst, m.unit, tracked=tracked)


def timing_cells(fwd: Any, both: Any) -> list[str]:
    """fwd / fwd+bwd median / p90 / min / bwd estimate (the difference of the two medians shown
    beside it, `conventions.bwd_estimate`)."""
    return [
        ms(median(fwd)),
        ms(median(both)),
        ms(None if both is None else both.p90),
        ms(None if both is None else both.min),
        ms(cv.bwd_estimate(median(fwd), median(both))),
    ]


def counts(rows: Iterable[Variant], params: Sequence[str]) -> str:
    """'warm-up 5, repeat 20' from the rows' parameters (every distinct value named)."""
    rows = list(rows)
    parts = []
    for key, label in zip(params, ("warm-up", "repeat"), strict=True):
        values = sorted({v.params.get(key) for v in rows if v.params.get(key) is not None}, key=str)
        if values:
            parts.append(f"{label} {'/'.join(str(x) for x in values)}")
    return ", ".join(parts)


def varying(rows: Sequence[Variant], keys: Sequence[str]) -> list[str]:
    """The parameters among `keys` that take more than one value over `rows`."""
    return [k for k in keys if len({views.params_key({"v": r.params.get(k)}) for r in rows}) > 1]


def shape_key(v: Variant, drop: Iterable[str]) -> str:
    """The row's parameters without `drop`: rows of one shape under another mode or backend."""
    dropped = set(drop)
    return views.params_key({k: x for k, x in v.params.items() if k not in dropped})


def case_link(text: str, j: ReportJob, v: Variant, links: Links) -> Cell:
    return Cell(str(text), links.case(j.job_id, v.case.fingerprint))


def rows_of(jobs: Iterable[ReportJob]) -> list[tuple[ReportJob, Variant]]:
    """Every case variant of these jobs (`report_tables.variants`), with its job."""
    return [(j, v) for j in jobs for v in variants(j.data.cases)]


# --------------------------------------------------------------------------------- comparisons


def values_of(j: ReportJob, v: Variant, measure: str) -> Any:
    """The rank-reduced repetitions of a variant's measure (its metric-name prefix restored)."""
    return j.values(v.case.fingerprint, f"{v.token}_{measure}" if v.token else measure)


def compare(
    j_against: ReportJob, against: Variant, j_these: ReportJob, these: Variant, measure: str = "fwd_bwd_ms"
) -> Difference:
    """`these` repetitions against `against`'s (a time, lower is better), by the judgment's rule
    on the device the later job ran on."""
    return difference(
        values_of(j_against, against, measure),
        values_of(j_these, these, measure),
        direction="lower",
        device=j_these.device,
    )


def claim_text(d: Difference, style: Literal["gain", "speedup", "ratio"]) -> str:
    """The judgment's description of `d` (`Difference.describe`): the value with its interval
    where the data supports a claim, else 'no significant difference' with the interval."""
    return d.describe(style)


def gain_text(d: Difference) -> str:
    """Time saved, (U − P) / U, with its interval; 'no significant difference' unless it holds."""
    return claim_text(d, "gain")


def speedup_text(d: Difference) -> str:
    return claim_text(d, "speedup")


def growth_text(d: Difference, none: str = "no significant difference") -> str:
    """(after − before) / before (`conventions.growth`) with its interval: the judgment's ratio
    after/before minus one; `none` unless the interval supports a claim (a scaling statement
    says 'no change the data can support')."""
    if d.verdict == "unknown":
        return d.describe()
    g, lo, hi = d.ratio - 1.0, d.ci_low - 1.0, d.ci_high - 1.0
    ci = f"{d.ci_level:.0%} CI {cv.percent(lo, signed=True)} to {cv.percent(hi, signed=True)}"
    if not d.significant:
        return f"{none} ({ci}{d.why_no_claim()})"
    return f"{cv.percent(g, signed=True)} ({ci})"


def against_ulysses(
    rows: Sequence[tuple[ReportJob, Variant]], modes: Sequence[str], drop: Sequence[str] = ("mode",)
) -> dict[int, Difference]:
    """id(variant) -> each `modes` row against the Ulysses row of the same job and shape."""
    by = {(j.job_id, shape_key(v, drop)): (j, v) for j, v in rows if v.params.get("mode") == BASE_MODE}
    out = {}
    for j, v in rows:
        found = by.get((j.job_id, shape_key(v, drop)))
        if v.params.get("mode") in modes and found is not None and "fwd_bwd_ms" in found[1].metrics:
            out[id(v)] = compare(found[0], found[1], j, v)
    return out
