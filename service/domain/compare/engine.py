"""The engine: two sides matched case by case (fingerprint) and metric by metric, the time
statistics batched, and the `Comparison` built; or, across hardware or a definition change,
every case `incomparable` with the reason."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from service.domain.compare.config import CompareConfig
from service.domain.compare.judgment import Rule, reference_case_params, time_change
from service.domain.compare.results import CaseResult, Comparison, MetricResult
from service.domain.compare.series import series_of
from service.domain.compare.sides import CaseInfo, JobRef, JobSide
from service.domain.compare.time_stats import time_stats_batch
from service.domain.compare.verdicts import first_line, metric_result, settle_case
from workers.suite import Metric


def _UNDECLARED(name: str) -> Metric:
    """A metric no side declares: no scale is known, so it is only recorded."""
    return Metric(name, "", "accuracy", diagnostic=True)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Build many small objects without the cyclic garbage collector's passes.

    A comparison of two 100k-sample jobs creates ~40k results and summaries (no reference
    cycles); their allocations trigger collections, and in a server process the older
    generations' passes walk every object the server holds.
    Nested or concurrent uses are safe: only the outermost one that found the collector on turns it
    back on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def compare(base: JobSide, head: JobSide, config: CompareConfig | None = None) -> Comparison:
    """Compare `head` against `base` case by case; cases matched by fingerprint."""
    with collector_paused():
        return _compare(base, head, config)


def _compare(base: JobSide, head: JobSide, config: CompareConfig | None) -> Comparison:
    cfg = config or CompareConfig()
    why_not = incomparable_reason(base.ref, head.ref)
    if why_not is not None:
        return _incomparable(base, head, cfg, why_not)
    device = head.ref.device or base.ref.device or None
    same_code = base.ref.code is not None and base.ref.code == head.ref.code
    metrics: dict[str, Metric] = {**base.metrics, **head.metrics}
    bser = series_of(base.samples, metrics)
    hser = series_of(head.samples, metrics)
    # one rule per metric name of either side, worked out before the per-group loops
    rules: dict[str, Rule] = {
        name: Rule.of(metrics.get(name) or _UNDECLARED(name), cfg, device, same_code)
        for name in dict.fromkeys([*base.samples.metric_keys, *head.samples.metric_keys])
    }
    bsums = bser.summaries([rules[m].metric for _, m in bser.keys])
    hsums = hser.summaries([rules[m].metric for _, m in hser.keys])
    bgroups: dict[tuple[str, str], int] = {k: g for g, k in enumerate(bser.keys)}
    hgroups: dict[tuple[str, str], int] = {k: g for g, k in enumerate(hser.keys)}
    by_case_b: dict[str, list[str]] = {}
    for fp, m in bser.keys:
        by_case_b.setdefault(fp, []).append(m)
    by_case_h: dict[str, list[str]] = {}
    for fp, m in hser.keys:
        by_case_h.setdefault(fp, []).append(m)

    fps = list(dict.fromkeys([*head.cases, *by_case_h, *base.cases, *by_case_b]))
    reference_fp = _reference_cases(head)
    case_results: list[CaseResult] = []
    undecided: list[CaseResult] = []  # verdict waits for the batched time statistics
    # time pairs batched by (n_base, n_head): (metric result, base group, head group)
    pending: dict[tuple[int, int], list[tuple[MetricResult, int, int]]] = {}

    for fp in fps:
        binfo, hinfo = base.cases.get(fp), head.cases.get(fp)
        in_base = binfo is not None or fp in by_case_b
        in_head = hinfo is not None or fp in by_case_h
        info = hinfo or binfo or CaseInfo(fp, fp)
        bstat = (binfo.status or "passed") if binfo else ("passed" if in_base else None)
        hstat = (hinfo.status or "passed") if hinfo else ("passed" if in_head else None)
        cr = CaseResult(
            fingerprint=fp,
            name=info.name,
            params=dict(info.params),
            verdict="unchanged",
            reason="",
            base_status=bstat,
            head_status=hstat,
            base_error=binfo.error if binfo else None,
            head_error=hinfo.error if hinfo else None,
            base_source_job=binfo.source_job_id if binfo else None,
            head_source_job=hinfo.source_job_id if hinfo else None,
        )
        case_results.append(cr)
        if hstat == "error":
            cr.verdict, cr.reason = "errored", f"head run errored: {first_line(cr.head_error)}"
            continue
        if not in_head:
            cr.verdict, cr.reason = "removed", "case only in base"
            continue
        if hstat == "skipped":
            cr.verdict, cr.reason = "skipped", "skipped on head"
            continue
        base_usable = in_base and bstat not in ("error", "skipped")
        hnames, bnames = by_case_h.get(fp, []), (by_case_b.get(fp, []) if base_usable else [])
        names = hnames if hnames == bnames else list(dict.fromkeys([*hnames, *bnames]))
        results = cr.metrics
        ref_fp = reference_fp.get(fp)
        ref_info = head.cases.get(ref_fp) if ref_fp is not None else None
        ref_job = ref_info.source_job_id if ref_info is not None else None
        for name in names:
            key = (fp, name)
            bg = bgroups.get(key) if base_usable else None
            hg = hgroups.get(key)
            rg = hgroups.get((ref_fp, name)) if ref_fp is not None else None
            reference = hsums[rg].worst if rg is not None else None
            results.append(metric_result(rules[name], bser, bsums, bg, hser, hsums, hg, pending, reference,
                                         ref_job))
        undecided.append(cr)

    for (n1, n2), items in pending.items():
        bidx = np.array([bg for _, bg, _ in items])
        hidx = np.array([hg for _, _, hg in items])
        base_vals = bser.values[bser.starts[bidx][:, None] + np.arange(n1)]
        head_vals = hser.values[hser.starts[hidx][:, None] + np.arange(n2)]
        medians = np.array([(mr.base.median, mr.head.median) for mr, _, _ in items])  # type: ignore[union-attr]
        stats = time_stats_batch(base_vals, head_vals, medians, cfg)
        rows = zip(stats.ratio.tolist(), stats.ci_low.tolist(), stats.ci_high.tolist(), stats.p.tolist(),
                   strict=True)
        for (mr, _, _), (r, lo, hi, p) in zip(items, rows, strict=True):
            mr.ratio, mr.ci_low, mr.ci_high = r, lo, hi
            mr.p_value = p if p == p else None
            mr.verdict, mr.reason = time_change(r, lo, hi, mr.p_value, rules[mr.metric], cfg)
    for cr in undecided:
        settle_case(cr, cr.base_status is not None, cr.base_status)
    return Comparison(head.ref.suite or base.ref.suite, base.ref, head.ref, cfg, case_results)


def _reference_cases(side: JobSide) -> dict[str, str]:
    """fingerprint -> the fingerprint of its reference case in the same job (the same parameters
    run by the reference backend, `judgment.reference_case_params`), where the job has one."""
    def key(params: object) -> str:
        return json.dumps(params, sort_keys=True, default=str)

    by_params = {key(dict(c.params)): fp for fp, c in side.cases.items()}
    out = {}
    for fp, c in side.cases.items():
        ref = reference_case_params(c.params)
        if ref is not None and key(ref) in by_params:
            out[fp] = by_params[key(ref)]
    return out


def incomparable_reason(base: JobRef, head: JobRef) -> str | None:
    """Why two jobs' results cannot be compared (other hardware, another definition), or None."""
    if base.device and head.device and base.device != head.device:
        return f"device kind {base.device!r} vs {head.device!r}"
    if base.world_size != head.world_size:
        return f"world size {base.world_size} vs {head.world_size}"
    if base.device_name and head.device_name and base.device_name != head.device_name:
        return f"hardware {base.device_name!r} vs {head.device_name!r}"
    versions = (base.suite_version, head.suite_version)
    if None not in versions and versions[0] != versions[1]:
        return f"suite definition version {versions[0]} vs {versions[1]}"
    return None


def _incomparable(base: JobSide, head: JobSide, cfg: CompareConfig, why: str) -> Comparison:
    """Every case `incomparable` with the reason: no statistic is computed across a hardware or
    definition change."""
    fps = list(dict.fromkeys([*head.cases, *base.cases]))
    results = []
    for fp in fps:
        info = head.cases.get(fp) or base.cases[fp]
        b, h = base.cases.get(fp), head.cases.get(fp)
        results.append(CaseResult(fp, info.name, dict(info.params), "incomparable", f"not comparable: {why}",
                                  b.status if b else None, h.status if h else None))
    return Comparison(head.ref.suite or base.ref.suite, base.ref, head.ref, cfg, results)
