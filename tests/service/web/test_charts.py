"""Unit tests of the pages' SVG charts: plain data in, marks out."""

from __future__ import annotations

import re

import numpy as np

from service.web import charts


def test_timing_distribution_draws_every_repetition_then_bins_large_lanes() -> None:
    rng = np.random.default_rng(0)
    lanes = [charts.Lane("fwd_ms", r, rng.normal(10, 1, 20)) for r in range(4)]
    worst = np.max([lane.values for lane in lanes], axis=0)
    svg = str(charts.timing_distribution(lanes, {"fwd_ms": worst}, title="t"))
    assert svg.count('class="rep"') == 80 and svg.count('class="box"') == 1
    assert "<title" in svg and "median" in svg
    big = [charts.Lane("fwd_ms", 0, rng.normal(10, 1, 50_000))]
    svg = str(charts.timing_distribution(big, {"fwd_ms": big[0].values}))
    assert 'class="rep"' not in svg
    n_bins = svg.count('class="bin"')
    assert 0 < n_bins <= charts.BINS and "n=50000 binned" in svg
    counts = [int(c) for c in re.findall(r"rank 0: (\d+) of 50000", svg)]
    assert sum(counts) == 50_000  # every sample is counted in a bin


def test_trajectory_bins_long_series_to_their_worst_value_and_marks_nonfinite_steps() -> None:
    steps = np.arange(2000)
    vals = np.full(2000, 1e-5)
    vals[1234] = 3e-4
    svg = str(charts.trajectory_chart([charts.Trajectory("loss_max_rel", steps, vals, bound=4e-4)]))
    pts = re.search(r'class="traj" stroke="[^"]+" style="[^"]+" points="([^"]+)"', svg).group(1).split()
    assert len(pts) <= charts.MAX_STEPS + 1 and "max per 5 steps" in svg
    assert "worst 3.000e-04" in svg  # the spike survives the binning
    short = np.array([1e-5, np.nan, 2e-5])
    svg = str(charts.trajectory_chart([charts.Trajectory("gn", np.arange(3), short)]))
    assert svg.count('class="step"') == 2 and svg.count('class="nonfinite"') == 1


def test_sweep_goes_log_only_when_its_values_span_decades() -> None:
    """An eager baseline 300× the fused kernels: log10, so the fast lines stay apart; values within
    two decades keep the linear axis from zero."""
    sizes = [16384, 65536]

    def y_of(svg: str, name: str) -> list[float]:
        tips = re.findall(r'cy="([0-9.]+)" r="3"[^>]*><title>' + name, svg)
        return [float(t) for t in tips]

    wide = str(charts.sweep_chart([charts.SweepSeries("eager", sizes, [830.0, 4650.0]),
                                   charts.SweepSeries("fla", sizes, [3.7, 14.8]),
                                   charts.SweepSeries("flashqla", sizes, [1.4, 4.7])], title="t", unit="ms"))
    assert "log scale" in wide
    fla, qla = y_of(wide, "fla at"), y_of(wide, "flashqla at")
    assert all(a < b - 20 for a, b in zip(fla, qla, strict=True))  # SVG y grows downwards: fla above
    narrow = str(charts.sweep_chart([charts.SweepSeries("fla", sizes, [3.7, 14.8]),
                                     charts.SweepSeries("flashqla", sizes, [1.4, 4.7])],
                                    title="t", unit="ms"))
    assert "log scale" not in narrow and ">0</text>" in narrow


def test_history_line_and_sparkline_have_one_mark_per_commit() -> None:
    pts = [charts.SeriesPoint(f"c{i}", 10.0 + i, 9.0 + i, 12.0 + i, 20, f"/jobs/{i}") for i in range(7)]
    svg = str(charts.history_line(pts, unit="ms", bound=30.0))
    assert svg.count('class="point"') == 7 and svg.count('href="/jobs/') == 7 and 'class="bound"' in svg
    spark = str(charts.sparkline([1.0, None, 3.0], title="s"))
    assert 'class="last"' in spark and "first 1, last 3" in spark
