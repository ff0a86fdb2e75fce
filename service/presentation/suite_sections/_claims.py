"""Conclusion lines several suites' sections write: the worst error against its bound, and a
difference over several shapes, claimed only where every interval supports it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from service.domain.compare.judgment import Difference
from service.presentation.numbers import fmt
from service.presentation.report_cells import claim_text, length
from service.presentation.report_model import ReportJob
from service.presentation.report_tables import Variant

GROWTH_FACTOR = 2.0  # an error "grows with T" when the longest T's worst exceeds this × the shortest's


@dataclass(frozen=True)
class WorstError:
    """One tensor's worst relative-L2 of one row."""

    value: float
    tensor: str
    seq_len: Any
    backend: Any
    bound: float | None


def worst_errors(
    rows: Iterable[tuple[ReportJob, Variant]], tensors: Sequence[tuple[str, str]]
) -> list[WorstError]:
    out = []
    for _, v in rows:
        for t, label in tensors:
            m = v.metrics.get(f"{t}_rel_l2")
            if m is not None:
                out.append(
                    WorstError(m.worst, label, v.params.get("seq_len"), v.params.get("backend"), m.bound)
                )
    return out


def _where(r: WorstError) -> str:
    return f"{r.tensor}, " + (f"{r.backend} " if r.backend else "") + f"T={length(r.seq_len)}"


def _growth_with_t(found: Sequence[WorstError]) -> str | None:
    by_t: dict[int, float] = {}
    for r in found:
        if isinstance(r.seq_len, int) and r.value == r.value:
            by_t[r.seq_len] = max(by_t.get(r.seq_len, 0.0), r.value)
    if len(by_t) < 2:
        return None
    lo, hi = min(by_t), max(by_t)
    grows = by_t[hi] > GROWTH_FACTOR * by_t[lo]
    return (
        f"{'grows' if grows else 'does not grow'} with T (worst {fmt(by_t[lo])} at {length(lo)}, "
        f"{fmt(by_t[hi])} at {length(hi)}; grows means more than {GROWTH_FACTOR:g}× the shortest T's)"
    )


def accuracy_line(label: str, found: Sequence[WorstError]) -> str | None:
    """The worst relative-L2, the values beyond their bound (the furthest named), whether the
    error grows with T."""
    if not found:
        return None
    nan = [r for r in found if r.value != r.value]
    if nan:
        first = nan[0]
        where = f"{first.tensor} at T={length(first.seq_len)}"
        return f"{label}: {len(nan)} tensor(s) not finite (first: {where})."
    w = max(found, key=lambda r: r.value)
    over = [r for r in found if r.bound is not None and r.value > r.bound]
    if over:
        first = max(over, key=lambda r: r.value / r.bound if r.bound else math.inf)
        held = (
            f"{len(over)} value(s) beyond their bound, the furthest {fmt(first.value)} > "
            f"{fmt(first.bound)} ({_where(first)}): FAILS"
        )
    else:
        held = (
            "every value within its metric's bound" if any(r.bound is not None for r in found) else "no bound"
        )
    own = f", bound {fmt(w.bound)}" if w.bound is not None else ""
    grows = _growth_with_t(found)
    return f"{label}: worst relative-L2 {fmt(w.value)} ({_where(w)}{own}); {held}" + (
        f"; it {grows}." if grows else "."
    )


Style = Literal["gain", "speedup", "ratio"]


def across_shapes(
    label: str, found: Sequence[tuple[str, Difference]], style: Style, faster: str, slower: str
) -> str:
    """`label`: each shape's difference as the judgment describes it, then, over several shapes, a
    claim across them only when every interval supports the same one ("P2P faster at every
    shape")."""
    parts = [f"{claim_text(d, style)} at {where}" for where, d in found]
    verdicts = {d.verdict for _, d in found}
    if len(found) == 1:
        return f"{label}: {parts[0]}."
    if verdicts == {"better"}:
        claim = f"{faster} at every shape"
    elif verdicts == {"worse"}:
        claim = f"{slower} at every shape"
    else:
        shown = sum(d.significant for _, d in found)
        claim = f"no claim across shapes ({shown} of {len(found)} significant)"
    return f"{label}: {'; '.join(parts)}; {claim}."
