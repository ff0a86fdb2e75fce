"""Conclusion lines several suites' sections write: the worst error against its bound, and a
difference over several shapes, claimed only where every interval supports it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from service.domain.compare.judgment import Difference
from service.presentation.estimates import CONFIG, NO_CHANGE, estimate
from service.presentation.numbers import fmt
from service.presentation.report_cells import claim_text, length, shape_key, values_of
from service.presentation.report_model import ReportJob
from service.presentation.report_tables import Variant


@dataclass(frozen=True)
class WorstError:
    """One tensor's worst relative-L2 of one row, with the row's values it summarises and what
    makes two rows alike but for their length (`like`)."""

    value: float
    tensor: str
    seq_len: Any
    backend: Any
    bound: float | None
    samples: np.ndarray = field(default_factory=lambda: np.empty(0), compare=False)
    like: str = ""  # the row's world size and parameters but its length: rows at two T compared


def worst_errors(
    rows: Iterable[tuple[ReportJob, Variant]], tensors: Sequence[tuple[str, str]]
) -> list[WorstError]:
    out = []
    for j, v in rows:
        for t, label in tensors:
            m = v.metrics.get(f"{t}_rel_l2")
            if m is not None:
                out.append(
                    WorstError(
                        m.worst,
                        label,
                        v.params.get("seq_len"),
                        v.params.get("backend"),
                        m.bound,
                        values_of(j, v, f"{t}_rel_l2"),
                        f"{j.world_size} {shape_key(v, ('seq_len',))}",
                    )
                )
    return out


def _where(r: WorstError) -> str:
    return f"{r.tensor}, " + (f"{r.backend} " if r.backend else "") + f"T={length(r.seq_len)}"


def _growth_with_t(found: Sequence[WorstError]) -> str | None:
    """Each tensor's error at the longest T against the shortest, of rows alike but for T (same
    world size, backend, mode, heads and every other parameter): the ratio of the medians with
    its bootstrap interval; growth claimed only where the interval lies above 1."""
    by: dict[tuple[str, str], dict[int, WorstError]] = {}
    for r in found:
        if isinstance(r.seq_len, int) and r.value == r.value:
            by.setdefault((r.tensor, r.like), {}).setdefault(r.seq_len, r)
    pairs = [(at[min(at)], at[max(at)]) for at in by.values() if len(at) >= 2]
    if not pairs:
        return None
    moved, held = [], 0
    for a, b in pairs:
        ratio = estimate([a.samples, b.samples], lambda m: m[..., 1] / m[..., 0])
        if ratio.excludes(1.0):
            way = "grows" if ratio.value > 1 else "falls"
            moved.append(
                f"{way} for {_where(a)} → {length(b.seq_len)}: ×{ratio.text(lambda x: f'{x:.2f}')}"
            )
        else:
            held += 1
    rule = (
        f"error at the longest T against the shortest, rows alike but for T (same backend, mode, heads "
        f"and other parameters): ratio of the medians, {CONFIG.ci_level:.0%} interval"
    )
    if not moved:
        return f"{NO_CHANGE} with T in any of {len(pairs)} comparison(s) ({rule})"
    rest = f"; {NO_CHANGE} in the other {held} of {len(pairs)}" if held else ""
    return f"{'; '.join(moved)}{rest} ({rule})"


def accuracy_line(label: str, found: Sequence[WorstError]) -> str | None:
    """The worst relative-L2, the values beyond their bound (the furthest named), and whether the
    error grows with T (`_growth_with_t`)."""
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
        f"; {grows}." if grows else "."
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
