"""Rank reduction and grouping: the worst rank per idx of each (case, metric), then every
group's statistics at once (`workers.stats`, the one rule every reader applies)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from service.domain.compare.sides import SampleTable
from workers.stats import MetricStats, group_stats, worst_rank
from workers.suite import Metric


@dataclass
class Series:
    """Rank-reduced values of one side: per (case, metric) group, values ordered by idx, and the
    statistics of every group computed at once (`workers.stats.group_stats`)."""

    keys: list[tuple[str, str]]  # (fingerprint, metric) per group
    starts: np.ndarray  # group g is values[starts[g]:starts[g+1]]
    idx: np.ndarray
    values: np.ndarray
    ranks: list[int]  # per group: the most ranks that reported one idx
    samples: list[int]  # per group: the raw rows (over all ranks)

    def get(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = self.starts[g], self.starts[g + 1]
        return self.idx[s:e], self.values[s:e]

    def summaries(self, metrics: list[Metric]) -> list[MetricStats]:
        """Every group's statistics; `metrics[g]`: group g's metric definition."""
        if not self.keys:
            return []
        st = group_stats(self.starts, self.values, [m.direction != "higher" for m in metrics], self.idx)
        about = [(m.name, m.unit, m.kind, m.direction, m.bound) for m in metrics]
        return st.records(about, self.samples, self.ranks)


def series_of(samples: SampleTable, metrics: Mapping[str, Metric]) -> Series:
    """Worst rank per (case, metric, idx) (`workers.stats.worst_rank`), grouped by (case, metric).

    Rows the store reduced already (`SampleTable.ranks`), one per (case, metric, idx) in that
    order, are taken as they are: only their grouping is worked out.
    """
    n = len(samples)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return Series([], np.zeros(1, dtype=np.int64), empty, np.zeros(0), [], [])
    n_metrics = max(len(samples.metric_keys), 1)
    metric_col = np.asarray(samples.metric, dtype=np.int64)
    group = np.asarray(samples.case, dtype=np.int64) * n_metrics + metric_col
    idx_col = np.asarray(samples.idx, dtype=np.int64)
    in_order = samples.ranks is not None and _one_row_per_idx_in_order(group, idx_col)
    if in_order:
        run_group, run_idx = group, idx_col
        values = np.asarray(samples.value, dtype=np.float64)
        reported = np.asarray(samples.ranks, dtype=np.int64)
    else:
        higher = {name for name, m in metrics.items() if m.direction == "higher"}
        lower_of_metric = np.array([m not in higher for m in samples.metric_keys] or [True])
        red = worst_rank(group, idx_col, samples.value, lower_of_metric[metric_col])
        run_group, run_idx, values = red.group, red.idx, red.value
        reported = None if samples.ranks is None else np.asarray(samples.ranks, dtype=np.int64)
    new_group = np.empty(len(run_group), dtype=bool)  # group starts among the reduced rows
    new_group[0] = True
    new_group[1:] = run_group[1:] != run_group[:-1]
    gstarts = np.flatnonzero(new_group)
    groups = run_group[gstarts]
    starts = np.append(gstarts, len(run_group))
    if reported is not None and in_order:  # pre-reduced rows
        ranks_per_group = np.maximum.reduceat(reported, gstarts)
        rows_per_group = np.add.reduceat(reported, gstarts)
    elif reported is not None:  # pre-reduced rows out of order: the most ranks any of its rows had
        ranks_per_group, rows_per_group = _most_ranks(group, reported, groups)
    else:
        ranks_per_group, rows_per_group = red.most_ranks, np.add.reduceat(red.ranks, gstarts)
    keys = list(
        zip(
            map(samples.case_keys.__getitem__, (groups // n_metrics).tolist()),
            map(samples.metric_keys.__getitem__, (groups % n_metrics).tolist()),
            strict=True,
        )
    )
    return Series(keys, starts, run_idx, values, ranks_per_group.tolist(), rows_per_group.tolist())


def _most_ranks(group: np.ndarray, reported: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group of `groups` (sorted), the largest `reported` of its rows and their sum."""
    order = np.argsort(group, kind="stable")
    g, r = group[order], reported[order]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    at = np.searchsorted(g[first], groups)
    return np.maximum.reduceat(r, first)[at], np.add.reduceat(r, first)[at]


def _one_row_per_idx_in_order(group: np.ndarray, idx: np.ndarray) -> bool:
    """Rows strictly increasing in (group, idx): one row per idx, grouped, as the store sends them."""
    dg = np.diff(group)
    return bool(np.all((dg > 0) | ((dg == 0) & (np.diff(idx) > 0))))
