"""The compare engine: two jobs of one suite, case by case (fingerprint) and metric by metric.

Pure and database-free: the store loader (`service.domain.baselines`) turns jobs into `JobSide`s, the
gate and the report render the resulting `Comparison`. Everything is vectorised with numpy so that
two jobs of 100k samples compare in well under half a second (`benchmarks/compare_bench.py`).

The rules are `workers.verdict`'s (its docstring says which statistic each kind is judged on and
the minimum effects); this module applies them to whole jobs at once:

- Samples are raw per rank. The worst rank of each idx is taken first, then statistics run over
  the idx axis. Jobs on other hardware, at another world size or with another suite definition
  version are *incomparable*: every case says so, with the reason, and nothing is computed.
- time (repeated): ratio of medians head/base, a percentile bootstrap CI of that ratio (fixed
  seed), and a two-sided Mann-Whitney U test. *regressed* only when significant (p < alpha) and
  larger than the minimum effect; *unchanged* when the change is within the minimum effect;
  *inconclusive* when it is larger but not significant (the gate then measures again); *improved*
  symmetric. A time metric with one value per case (`Metric.repeated` False: derived ratios) and
  a check are judged by their bound only; a move beyond the minimum effect is *changed* (recorded).
  A time `workers.verdict.time_not_judged` exempts (raw wall clock on a cpu; any time of two jobs
  whose code under test is byte-identical, `JobRef.code`) is shown with its statistics, its move
  beyond the minimum effect *changed*, never failing, re-measured or confirmed.
- memory: the worst value per side; regressed when it grows by more than the minimum effect (1 %)
  and more than 1 MiB (improved symmetric).
- accuracy: *failed* when the head's worst value breaks the bound (a non-finite value always
  does); *worsened* when it grows by more than the minimum effect (2x) above a small floor.
- trajectory: the worst value over steps against the bound, any NaN/Inf step fails; evidence
  carries the max abs / max rel difference head vs base over the common steps.
- Cases only in head are *added*, only in base *removed*; a case whose run errored on either side
  is *errored* and kept out of statistics (the head's bounds still count when only base errored).

The package, one module per job: `config` (the thresholds), `sides` (what is compared: a job's
cases, metric definitions and samples), `results` (what comes out: verdicts per metric and case,
and their severity), `series` (the rank reduction and per-group statistics of `workers.stats`),
`time_stats` (the bootstrap CI and the Mann-Whitney U test, batched), `judgment` (THE rule: one
function per metric kind, diagnostics, and `difference` for two sets of repetitions inside one
job), `verdicts` (the engine's groups handed to the judgment, and a case from its metrics) and
`engine` (matching cases and building the result).
"""

from service.domain.compare.config import MIB, UNIT_BYTES, CompareConfig, unit_bytes
from service.domain.compare.engine import collector_paused, compare, incomparable_reason
from service.domain.compare.judgment import Difference, difference, within_bound_text
from service.domain.compare.results import (
    FAILING,
    SEVERITY,
    VERDICTS,
    CaseResult,
    Comparison,
    MetricResult,
    Verdict,
    to_jsonable,
)
from service.domain.compare.series import Series, series_of
from service.domain.compare.sides import CaseInfo, JobRef, JobSide, SampleTable
from service.domain.compare.time_stats import BOOTSTRAP_ROWS

__all__ = [
    "BOOTSTRAP_ROWS", "FAILING", "MIB", "SEVERITY", "UNIT_BYTES", "VERDICTS", "CaseInfo", "CaseResult",
    "CompareConfig", "Comparison", "Difference", "JobRef", "JobSide", "MetricResult", "SampleTable", "Series",
    "Verdict", "collector_paused", "compare", "difference", "incomparable_reason", "series_of", "to_jsonable",
    "unit_bytes", "within_bound_text",
]
