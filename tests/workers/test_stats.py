"""The statistics module (workers.stats): the worst-rank rule for non-finite values, and grouped
statistics equal to the statistics of each series on its own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers import stats

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize(
    ("ranks", "want"),
    [
        ([1.0, 3.0, 2.0], {"lower": 3.0, "higher": 1.0}),
        ([1.0, -INF], {"lower": -INF, "higher": -INF}),  # not the max: a non-finite value wins
        ([INF, 1.0], {"lower": INF, "higher": INF}),  # not the min
        ([INF, -INF], {"lower": NAN, "higher": NAN}),  # ranks that disagree: NaN
        ([NAN, INF, 1.0], {"lower": NAN, "higher": NAN}),
    ],
)
def test_the_worst_rank_and_non_finite_values(ranks: list[float], want: dict[str, float]) -> None:
    for direction, value in want.items():
        (got,) = stats.reduce_ranks([(r, 0, v) for r, v in enumerate(ranks)], direction)
        assert got == value or (math.isnan(got) and math.isnan(value)), (ranks, direction, got)


def test_one_sample_is_every_statistic() -> None:
    st = stats.summarise_samples([(0, 0, 7.5)], "higher")
    assert (st.count, st.samples, st.ranks, st.nonfinite) == (1, 1, 1, 0)
    assert st.median == st.p90 == st.min == st.max == st.mean == st.worst == 7.5 and st.finite


def test_a_series_with_only_non_finite_values_has_no_statistics_but_counts_them() -> None:
    st = stats.summarise_samples([(0, 3, NAN), (0, 5, INF)], "lower")
    assert (st.count, st.nonfinite, st.first_nonfinite_idx) == (2, 2, 3)
    assert all(math.isnan(getattr(st, f)) for f in ("median", "p90", "min", "max", "mean", "worst"))


def test_grouped_statistics_equal_each_series_alone() -> None:
    rng = np.random.default_rng(5)
    series = [rng.normal(10, 3, n) for n in (1, 2, 9, 20)]
    series[2][[1, 4]] = [NAN, -INF]
    series[3][7] = INF
    lower = [True, False, True, False]
    starts = np.cumsum([0, *map(len, series)])
    idx = np.concatenate([np.arange(len(s)) * 2 for s in series])  # idx 0, 2, 4, ...
    grouped = stats.group_stats(starts, np.concatenate(series), lower, idx)
    for g, (values, low) in enumerate(zip(series, lower, strict=True)):
        alone = stats.summarise(values, "lower" if low else "higher")
        mine = grouped.record(g, direction="lower" if low else "higher")
        finite = values[np.isfinite(values)]
        assert mine.median == pytest.approx(np.median(finite), rel=1e-12)
        assert mine.p90 == pytest.approx(np.percentile(finite, 90), rel=1e-12)
        for f in ("count", "nonfinite", "median", "p90", "min", "max", "mean"):
            assert getattr(mine, f) == pytest.approx(getattr(alone, f), rel=1e-12), (g, f)
        bad = np.flatnonzero(~np.isfinite(values))
        assert mine.first_nonfinite_idx == (int(bad[0]) * 2 if len(bad) else None)
        assert math.isnan(mine.worst) == bool(len(bad))
    assert grouped.worst[0] == series[0][0] and grouped.worst[1] == series[1].min()
    about = [(f"m{g}", "ms", "time", "lower" if low else "higher", None) for g, low in enumerate(lower)]
    built = grouped.records(about, [len(s) for s in series], [1] * len(series))
    for g, rec in enumerate(built):
        one = grouped.record(g, metric=f"m{g}", unit="ms", kind="time", direction=about[g][3],
                             samples=len(series[g]))
        assert repr(rec) == repr(one)  # field by field, NaN included


def test_stored_worst_follows_the_direction_and_non_finite_count() -> None:
    assert stats.worst_value("lower", 1.0, 4.0, 0) == 4.0
    assert stats.worst_value("higher", 1.0, 4.0, 0) == 1.0
    assert math.isnan(stats.worst_value("higher", 1.0, 4.0, 1))
