"""The judgment: how a measured quantity moved, one function per metric kind, and the one
difference rule for two sets of repetitions.

Every verdict about a change reads this module: the compare engine (and through it the compare
page and API, the gate with its rounds and confirmations, history, campaign compare), `gdnval
run`'s table, the job page and the reports. The thresholds are `workers.verdict`'s constants and
`CompareConfig`'s statistics settings; nothing here is re-derived elsewhere.

- **Judged and diagnostic metrics.** A metric declares whether it is judged or a diagnostic
  (`Metric.diagnostic`). Element-wise max-relative / max-abs errors are diagnostics: dominated by
  reference values near zero, they move by large factors whenever a reduction order changes
  (a tile size, a fusion). A diagnostic is recorded and shown (`recorded`), never failing a job
  or a gate and never claimed as an improvement.
- **time** (`time_change`): the ratio of medians head/base, its bootstrap interval and the
  Mann-Whitney U test. A change is claimed (regressed/improved) only when it is significant
  (p < alpha), its interval excludes 1 and it is beyond the minimum effect; beyond the minimum
  effect without that, `inconclusive` (the gate measures again); within it, `unchanged`.
- **memory** (`memory_change`): the worst values, beyond the minimum effect (1 %) and 1 MiB.
- **accuracy / trajectory** (`accuracy_change`): the worst values; `worsened` only when the head
  is more than `1 + min_effect` times the base, above the floor (the accuracy floor and a tenth
  of the bound), *and* more than `REFERENCE_ERROR_FACTOR` times the reference backend's own error
  on the same case in the same job (`reference_case_params`), where the job has one: a backend
  within its bound and within that factor of eager's error is unchanged whatever its reduction
  order. A broken bound is `failed` (the engine checks bounds before any change).
- **checks and one-value times** (`recorded_change`): judged only by their bound; a move is
  `changed` (recorded).
- **two sets of repetitions** (`difference`): the same time rule for a gain or speed-up inside
  one job (P2P against Ulysses, a backend against its baseline), with its interval, so a page
  or a report writes a conclusion only when the data supports one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from service.domain.compare.config import MIB, UNIT_BYTES, CompareConfig, unit_bytes
from service.domain.compare.results import Verdict
from service.domain.compare.time_stats import time_stats_batch
from workers import verdict
from workers.stats import quantiles
from workers.suite import Metric

# The reference an accuracy change is measured against, beside the base: the same case with this
# backend, in the same job. A head error within this factor of the reference's is never worsened.
REFERENCE_BACKEND = "eager"
REFERENCE_ERROR_FACTOR = 10.0


@dataclass(frozen=True, slots=True)
class Rule:
    """What the rules need of one metric, worked out once per comparison instead of per case."""

    metric: Metric
    lower: bool  # lower is better
    judged_on_median: bool  # the bound's statistic (workers.verdict.JUDGED_ON)
    min_effect: float  # workers.verdict.min_effect for this metric on this device
    floor: float  # accuracy and trajectory: no 'worsened' at or below this absolute value
    memory_abs_bytes: float  # memory: no regression below this growth
    not_judged: str | None = None  # time: why it is shown but not judged (workers.verdict.time_not_judged)

    @classmethod
    def of(cls, metric: Metric, cfg: CompareConfig, device: str | None, same_code: bool = False) -> Rule:
        floor = cfg.accuracy_floor
        if metric.bound is not None:
            floor = max(floor, cfg.accuracy_floor_bound_frac * abs(metric.bound))
        return cls(
            metric,
            metric.direction != "higher",
            verdict.JUDGED_ON.get(metric.kind) == "median",
            verdict.min_effect(metric.kind, metric.min_effect, device),
            floor,
            cfg.memory_abs_bytes,
            verdict.time_not_judged(metric.min_effect, device, same_code) if metric.kind == "time" else None,
        )

    @property
    def diagnostic(self) -> bool:
        return self.metric.diagnostic


# ----------------------------------------------------------------------------- per kind


def interval_excludes_one(lo: float, hi: float) -> bool:
    """A ratio's interval lies wholly on one side of 1 (no difference is outside it)."""
    return (math.isfinite(lo) and lo > 1.0) or (math.isfinite(hi) and hi < 1.0)


def time_change(ratio: float, lo: float, hi: float, p: float | None, rule: Rule,
                cfg: CompareConfig) -> tuple[Verdict, str]:
    """A repeated time: regressed/improved only when significant, its interval excludes 1 and it
    is beyond the minimum effect; beyond the minimum effect otherwise -> inconclusive (the gate
    measures again until decided; it never passes a gate silently); within it -> unchanged."""
    eff = rule.min_effect
    moved = verdict.time_moved(ratio, eff, rule.metric.direction)
    testable = p is not None and p == p
    significant = testable and p < cfg.alpha and interval_excludes_one(lo, hi)  # type: ignore[operator]
    pct = f"{ratio - 1.0:+.1%}"
    ptxt = f"p={p:.2g}" if testable else "too few samples for significance"
    ci_txt = f"CI [{lo:.3f}, {hi:.3f}]"
    if rule.not_judged is not None:  # shown with its evidence, never a verdict that fails or waits
        if moved == "same":
            return "unchanged", f"median {pct} within ±{eff:.0%} ({ptxt}; not judged: {rule.not_judged})"
        return "changed", f"median {pct} ({ptxt}, {ci_txt}; recorded, not judged: {rule.not_judged})"
    if significant and moved in ("worse", "better"):
        why = f"median {pct} ({ptxt}, {ci_txt}; min effect {eff:.0%})"
        return ("regressed" if moved == "worse" else "improved"), why
    if moved == "same":
        return "unchanged", f"median {pct} within the min effect ±{eff:.0%} ({ptxt}, {ci_txt})"
    return "inconclusive", f"median {pct} exceeds ±{eff:.0%} but is not significant ({ptxt}, {ci_txt})"


def memory_change(b: float, h: float, rule: Rule) -> tuple[Verdict, str]:
    """Worst values: more than the minimum effect (1 % by default) and more than 1 MiB. A memory
    metric in another unit (a ratio of two peaks) has no absolute scale: only the relative rule."""
    metric = rule.metric
    eff = rule.min_effect
    grow = (h - b) if metric.direction == "lower" else (b - h)
    rel = grow / abs(b) if b else (math.inf if grow > 0 else 0.0)
    if metric.unit.strip().lower() not in UNIT_BYTES:
        why = f"{b:.4g} -> {h:.4g} ({rel:+.1%}, {metric.unit or 'no unit'})"
        if rel > eff:
            return "regressed", why
        if -rel > eff:
            return "improved", why
        return "unchanged", f"{b:.4g} -> {h:.4g} ({rel:+.1%}) within {eff:.0%}"
    grow_bytes = grow * unit_bytes(metric.unit)
    mib = grow_bytes / MIB
    if grow_bytes > rule.memory_abs_bytes and rel > eff:
        return "regressed", f"grew {mib:+.2f} MiB ({rel:+.1%})"
    if -grow_bytes > rule.memory_abs_bytes and -rel > eff:
        return "improved", f"shrank {mib:+.2f} MiB ({rel:+.1%})"
    return "unchanged", f"{mib:+.2f} MiB ({rel:+.1%}) within 1 MiB or {eff:.0%}"


def accuracy_change(b: float, h: float, rule: Rule, reference: float | None = None,
                    reference_job: int | None = None) -> tuple[Verdict, str]:
    """Worst errors of base and head: worsened only beyond the minimum effect (a factor, 2x by
    default) above the floor and, where the job has the reference backend on the same case,
    beyond `REFERENCE_ERROR_FACTOR` times the reference's error; improved symmetrically.
    `reference_job`: the job that measured the reference case, when the head job took it from
    one (the reason names it)."""
    floor = rule.floor
    f = 1.0 + rule.min_effect
    known = reference is not None and math.isfinite(reference)
    ref_level = REFERENCE_ERROR_FACTOR * reference if known else None  # type: ignore[operator]
    if rule.lower:
        worse = h > f * b and h > floor and (ref_level is None or h > ref_level)
        better = b > f * h and b > floor and (ref_level is None or b > ref_level)
    else:
        worse = b > f * h and b > floor
        better = h > f * b and h > floor
    by = f" (measured by job {reference_job})" if reference_job is not None else ""
    ref_txt = (f", {REFERENCE_ERROR_FACTOR:g}x the {REFERENCE_BACKEND} reference's {reference:.3g}{by}"
               if ref_level is not None else "")
    if worse:
        return "worsened", f"{b:.3g} -> {h:.3g} (more than {f:g}x, above floor {floor:.1g}{ref_txt})"
    if better:
        return "improved", f"{b:.3g} -> {h:.3g} (more than {f:g}x better)"
    if ref_level is not None and h > f * b and h > floor:
        within = f"within {REFERENCE_ERROR_FACTOR:g}x the {REFERENCE_BACKEND} reference's {reference:.3g}{by}"
        return "unchanged", f"{b:.3g} -> {h:.3g} ({within})"
    return "unchanged", f"{b:.3g} -> {h:.3g}"


def recorded_change(b: float, h: float, rule: Rule) -> tuple[Verdict, str]:
    """A check, a one-value time (a derived ratio) or a diagnostic: judged only by its bound (a
    diagnostic has none); a move beyond the kind's minimum effect is `changed`, recorded and never
    failing (for a derived ratio the metrics it derives from carry the verdict). Only a check or a
    one-value time that got better is `improved`; a diagnostic never claims anything."""
    metric = rule.metric
    if not (math.isfinite(b) and math.isfinite(h)):
        return "changed", f"{b:.4g} -> {h:.4g} (non-finite; recorded, not judged)"
    if rule.diagnostic:
        if b == h:
            return "unchanged", f"{h:g} (diagnostic)"
        return "changed", f"{b:.4g} -> {h:.4g} (diagnostic: recorded, never judged)"
    moved = _moved(metric.kind, metric.direction, b, h, rule.min_effect)
    if moved == "same":
        return "unchanged", f"{h:g}" if b == h else f"{b:.4g} -> {h:.4g}"
    if moved == "better":
        return "improved", f"{b:.4g} -> {h:.4g}"
    return "changed", f"{b:.4g} -> {h:.4g} (recorded, not judged)"


def _moved(kind: str, direction: str, b: float, h: float, effect: float) -> verdict.Change:
    """How one value moved against another by the minimum effect (a time by its ratio)."""
    if b == h:
        return "same"
    if kind == "time" and b > 0:
        return verdict.time_moved(h / b, effect, direction)
    rel = (h - b) / abs(b) if b else (math.inf if h > b else -math.inf)
    grow = rel if direction == "lower" else -rel
    if grow > effect:
        return "worse"
    if -grow > effect:
        return "better"
    return "same"


def reference_case_params(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parameters of the case whose error is the reference level of this one: the same case
    run by `REFERENCE_BACKEND` (None: the case names no backend, or is that backend)."""
    backend = params.get("backend")
    if not isinstance(backend, str) or backend == REFERENCE_BACKEND:
        return None
    return {**params, "backend": REFERENCE_BACKEND}


# ----------------------------------------------------------------------------- two sets of repetitions

DifferenceVerdict = Literal["better", "worse", "same", "inconclusive", "unknown"]


@dataclass(frozen=True, slots=True)
class Difference:
    """How `these` repetitions compare with `against` (both after the worst-rank reduction, one
    value per repetition): the ratio of medians these/against, its bootstrap interval, the
    two-sided Mann-Whitney p, and the verdict by the time rule (`time_change`). `significant`:
    a conclusion may be written (the interval excludes 1, p < alpha, beyond the minimum effect)."""

    ratio: float
    ci_low: float
    ci_high: float
    p_value: float | None
    verdict: DifferenceVerdict
    min_effect: float
    ci_level: float
    n_against: int
    n_these: int

    @property
    def significant(self) -> bool:
        return self.verdict in ("better", "worse")

    def speedup(self) -> tuple[float, float, float]:
        """against / these (how many times faster these are), with its interval."""
        return _inv(self.ratio), _inv(self.ci_high), _inv(self.ci_low)

    def gain(self) -> tuple[float, float, float]:
        """Time saved, 1 - these/against ((U - P) / U when against is Ulysses), with its interval."""
        return 1.0 - self.ratio, 1.0 - self.ci_high, 1.0 - self.ci_low

    def interval_text(self, style: Literal["gain", "speedup", "ratio"] = "ratio") -> str:
        """'95 % CI 1.10–1.37×' (speedup, ratio) or '95 % CI −4.7 % to +16.6 %' (gain)."""
        level = f"{self.ci_level:.0%} CI"
        if style == "gain":
            _, lo, hi = self.gain()
            return f"{level} {lo:+.1%} to {hi:+.1%}"
        _, lo, hi = self.speedup() if style == "speedup" else (self.ratio, self.ci_low, self.ci_high)
        return f"{level} {lo:.3g}–{hi:.3g}×"

    def why_no_claim(self) -> str:
        """What keeps a difference from being a claim, as a suffix for its interval: too few
        repetitions to test, or an interval that excludes 1 but stays within the minimum effect
        (on a CPU a raw time's is a doubling); '' when the data is merely not significant."""
        if self.p_value is None:
            return ", too few repetitions for significance"
        if self.verdict == "same" and interval_excludes_one(self.ci_low, self.ci_high):
            return f"; within the ±{self.min_effect:.0%} minimum effect"
        return ""

    def describe(self, style: Literal["gain", "speedup", "ratio"] = "ratio") -> str:
        """The claim the data supports: the value with its interval when significant, else 'no
        significant difference' with the interval and what kept it from a claim."""
        if self.verdict == "unknown":
            return "no difference can be given (no finite positive medians)"
        ci = self.interval_text(style)
        if not self.significant:
            return f"no significant difference ({ci}{self.why_no_claim()})"
        if style == "gain":
            return f"{self.gain()[0]:+.1%} ({ci})"
        if style == "speedup":
            s = self.speedup()[0]
            return f"{s:.3g}× {'faster' if s > 1 else 'slower'} ({ci})"
        return f"{self.ratio:.3g}× ({ci})"


def _inv(x: float) -> float:
    return 1.0 / x if x and math.isfinite(x) else math.nan


def difference(
    against: Sequence[float] | np.ndarray,
    these: Sequence[float] | np.ndarray,
    *,
    direction: str = "lower",
    min_effect: float | None = None,
    device: str | None = None,
    cfg: CompareConfig | None = None,
) -> Difference:
    """The time rule applied to two sets of repetitions (non-finite values dropped): the same
    statistics and thresholds as a comparison of two jobs (`time_change`), so a gain printed in a
    table means what a compare verdict means. `min_effect` None: the time kind's on `device`."""
    cfg = cfg or CompareConfig()
    a = np.asarray(against, dtype=np.float64).ravel()
    b = np.asarray(these, dtype=np.float64).ravel()
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    eff = verdict.min_effect("time", min_effect, device)
    nan = math.nan
    if not (a.size and b.size):
        return Difference(nan, nan, nan, None, "unknown", eff, cfg.ci_level, a.size, b.size)
    med_a, med_b = quantiles(a, [0.5])[0], quantiles(b, [0.5])[0]
    if med_a <= 0 or med_b <= 0:
        return Difference(nan, nan, nan, None, "unknown", eff, cfg.ci_level, a.size, b.size)
    st = time_stats_batch(a[None, :], b[None, :], np.array([[med_a, med_b]]), cfg)
    ratio, lo, hi = float(st.ratio[0]), float(st.ci_low[0]), float(st.ci_high[0])
    p = float(st.p[0])
    p_value = p if p == p else None
    rule = Rule.of(Metric("difference", "", "time", direction, min_effect=eff), cfg, device)  # type: ignore[arg-type]
    judged, _ = time_change(ratio, lo, hi, p_value, rule, cfg)
    by_verdict: dict[str, DifferenceVerdict] = {
        "regressed": "worse", "improved": "better", "unchanged": "same", "inconclusive": "inconclusive",
    }
    return Difference(ratio, lo, hi, p_value, by_verdict.get(judged, "unknown"), eff, cfg.ci_level,
                      a.size, b.size)


def within_bound_text(bound: float, values: Mapping[str, float], direction: str = "lower") -> str:
    """Errors of several modes against their common bound, never as a ratio of values far below
    it: 'both within 1e-09: p2p 3.1e-07, ulysses 6.4e-09', or which ones break it."""
    shown = ", ".join(f"{name} {value:.2g}" for name, value in values.items())
    op = "<=" if direction == "lower" else ">="
    breaking = [n for n, v in values.items() if not verdict.bound_holds(v, bound, direction)]
    if not breaking:
        every = "both" if len(values) == 2 else f"all {len(values)}"
        return f"{every} within {bound:.2g}: {shown}"
    verb = "breaks" if len(breaking) == 1 else "break"
    return f"{', '.join(breaking)} {verb} the bound {op} {bound:.2g}: {shown}"
