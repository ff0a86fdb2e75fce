"""Unit tests of the pages' view models: plain data in, rows out (the SVG charts are
tests/service/web/test_charts.py's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.presentation import views
from service.presentation.numbers import fmt
from workers.stats import MetricStats, worst_value


def M(metric: str, kind: str, median: float, min: float = 0.0, max: float = 0.0, p90: float = 0.0,
      unit: str = "", direction: str = "lower", bound: float | None = None, count: int = 1,
      ranks: int = 1) -> MetricStats:
    """The store's record of one metric, built as the store builds it (worst from min and max)."""
    return MetricStats(metric, unit, kind, direction, bound, count, count * ranks, ranks, median, p90, min,
                       max, median, worst=worst_value(direction, min, max, 0))


@dataclass
class C:
    name: str
    params: dict[str, Any]
    metrics: dict[str, MetricStats] = field(default_factory=dict)
    fingerprint: str = ""
    status: str | None = "passed"
    error: str | None = None
    expected_error: str | None = None
    source_job_id: int | None = None

    def __post_init__(self) -> None:
        self.fingerprint = self.fingerprint or f"fp-{self.name}"


def _acc(name: str, value: float, bound: float | None = None, direction: str = "lower") -> MetricStats:
    return M(name, "accuracy", value, value, value, value, direction=direction, bound=bound)


def test_accuracy_rows_group_tensors_and_judge_by_worst_rank() -> None:
    case = C("s8k", {"seq": 8192}, {
        "o_rel_l2": _acc("o_rel_l2", 5.86e-3, 1e-2),
        "o_max_abs": _acc("o_max_abs", 0.03),
        "o_finite": _acc("o_finite", 1.0, 1.0, "higher"),
        "dq_rel_l2": M("dq_rel_l2", "accuracy", 5e-3, 4e-3, 2e-2, 1e-2, bound=1e-2),  # worst rank breaks it
        "dq_finite": _acc("dq_finite", 0.0, 1.0, "higher"),
        "drift": _acc("drift", 0.5),
    })
    rows = views.accuracy_rows([case])
    by_tensor = {r.tensor: r for r in rows}
    assert set(by_tensor) == {"o", "dq", "drift"}
    assert rows[0].span == 3 and all(r.span == 0 for r in rows[1:])
    o = by_tensor["o"].cells
    assert o["rel_l2"].text == "5.860e-03" and o["rel_l2"].state == "ok" and o["rel_l2"].mark == "✓"
    assert o["finite"].text == "yes" and "max_rel" not in o
    dq = by_tensor["dq"].cells
    assert dq["rel_l2"].text == "0.02" and dq["rel_l2"].state == "bad" and "✗" in dq["rel_l2"].mark
    assert dq["finite"].text == "NO" and dq["finite"].state == "bad"
    assert by_tensor["drift"].cells["other"].text == "0.5"


def test_speed_rows_compute_speedup_against_the_eager_and_ulysses_siblings() -> None:
    t = {"seq": 8192}
    eager = C("eager", {**t, "backend": "eager"}, {"fwd_bwd_ms": M("fwd_bwd_ms", "time", 1265.0, unit="ms")})
    triton = C("triton", {**t, "backend": "triton"}, {"fwd_bwd_ms": M("fwd_bwd_ms", "time", 100.0, unit="ms",
                                                                     ranks=4, count=20)})
    uly = C("uly", {"mode": "ulysses"}, {"layer_ms": M("layer_ms", "time", 114.4, unit="ms")})
    p2p = C("p2p", {"mode": "p2p"}, {"layer_ms": M("layer_ms", "time", 100.0, unit="ms")})
    rng = np.random.default_rng(0)
    reps = {"eager": 1265.0, "triton": 100.0, "uly": 114.4, "p2p": 100.0}  # repetitions around the medians
    values = {(f"fp-{name}", metric): med * (1 + 0.005 * rng.standard_normal(20))
              for name, med in reps.items() for metric in ("fwd_bwd_ms", "layer_ms")}
    rows = {r.case: r
            for r in views.speed_rows([eager, triton, uly, p2p], lambda fp, m: values[(fp, m)], "cuda")}
    tri = rows["triton"].speedup
    assert tri.text.startswith("12.") and "× [12." in tri.text and tri.mark == "faster" and tri.state == "ok"
    assert rows["triton"].baseline == "vs eager (eager)" and rows["triton"].n == "20 × 4 ranks"
    gain = rows["p2p"].speedup  # a CP mode's gain: time saved, (114.4 − 100) / 114.4, with its interval
    assert gain.text.startswith("+12.") and gain.state == "ok" and "95% CI" in gain.title
    assert rows["eager"].speedup.text == "–" and rows["uly"].speedup.text == "–"
    # the same medians from repetitions that overlap: no claim, marked ~ and not coloured
    noisy = {(f"fp-{name}", "layer_ms"): med * (1 + 0.4 * rng.standard_normal(4))
             for name, med in reps.items()}
    rows = {r.case: r for r in views.speed_rows([uly, p2p], lambda fp, m: noisy[(fp, m)], "cuda")}
    assert rows["p2p"].speedup.text.startswith("~ ") and rows["p2p"].speedup.state == "none"
    assert rows["p2p"].speedup.title.startswith("no significant difference")
    # without the repetitions no interval is claimed
    rows = {r.case: r for r in views.speed_rows([uly, p2p])}
    assert rows["p2p"].speedup.text == "+12.6% (no interval)" and rows["p2p"].speedup.state == "none"


def test_one_case_with_every_backend_compares_metrics_by_prefix() -> None:
    """gdn-op measures eager, triton and fla in one case: 'triton_x' is judged against 'eager_x'."""
    mib = 1024**2
    case = C("T8k", {"seq_len": 8192}, {
        "eager_fwd_bwd_ms": M("eager_fwd_bwd_ms", "time", 1265.0, unit="ms"),
        "triton_fwd_bwd_ms": M("triton_fwd_bwd_ms", "time", 100.0, unit="ms"),
        "speedup_vs_eager": M("speedup_vs_eager", "time", 12.65, unit="x", direction="higher"),
        "eager_peak_bytes": M("eager_peak_bytes", "memory", 0, max=384 * mib, unit="bytes"),
        "triton_peak_bytes": M("triton_peak_bytes", "memory", 0, max=100 * mib, unit="bytes"),
        "triton_o_rel_l2": _acc("triton_o_rel_l2", 1e-3, 5e-3),
        "triton_o_finite": M("triton_o_finite", "check", 1.0, 1.0, 1.0, direction="higher", bound=1.0),
        "import_ok": M("import_ok", "check", 1.0, 1.0, 1.0, direction="higher", bound=1.0),
    })
    speed = {r.metric: r for r in views.speed_rows([case])}
    assert speed["triton_fwd_bwd_ms"].speedup.text == "12.65× (no interval)"
    assert speed["triton_fwd_bwd_ms"].baseline == "vs eager_fwd_bwd_ms"
    assert speed["speedup_vs_eager"].speedup.text == "–" and speed["eager_fwd_bwd_ms"].speedup.text == "–"
    mem = {r.metric: r for r in views.memory_rows([case])}
    assert mem["triton_peak_bytes"].versus.text == "3.84× lower"
    acc = views.accuracy_rows([case])
    assert [(r.tensor, sorted(r.cells)) for r in acc] == [("triton_o", ["finite", "rel_l2"])]
    assert [r.metric for r in views.value_rows([case], "check")] == ["import_ok"]


def test_memory_rows_report_bytes_in_mib_and_the_factor_against_the_baseline() -> None:
    mib = 1024**2
    eager = C("e", {"backend": "eager"}, {"peak": M("peak", "memory", 0, max=384 * mib, unit="bytes")})
    triton = C("t", {"backend": "triton"}, {"peak": M("peak", "memory", 0, max=100 * mib, unit="bytes")})
    rows = {r.case: r for r in views.memory_rows([eager, triton])}
    assert rows["t"].value.text == "100.0 MiB" and rows["t"].versus.text == "3.84× lower"


def test_case_views_flag_out_of_bound_cases_with_a_word() -> None:
    ok = C("ok", {}, {"x": _acc("x_rel_l2", 1e-3, 1e-2)})
    bad = C("bad", {}, {"x": _acc("x_rel_l2", 1e-1, 1e-2)})
    err = C("err", {}, status="error", error="boom")
    out = {v.name: v for v in views.case_views([ok, bad, err])}
    assert out["ok"].status == "passed" and out["bad"].status == "out of bound"
    assert out["bad"].bad_metrics == ["x_rel_l2"] and out["err"].status_class == "st-error"


def test_fmt_is_readable_at_every_scale() -> None:
    assert fmt(5.86e-3) == "5.860e-03" and fmt(12.6543, "ms") == "12.65 ms"
    assert fmt(1686.321, "ms") == "1686.3 ms" and fmt(float("nan")) == "NaN"
    assert fmt(None) == "–" and fmt(0.0) == "0"


def test_compare_rows_hide_unchanged_metrics_unless_asked() -> None:
    """Through the real compare engine: a planted 30% slowdown is the only row by default."""
    from service.domain.compare import CaseInfo, JobRef, JobSide, SampleTable, compare
    from workers.suite import Metric

    rng = np.random.default_rng(3)
    metrics = {"fwd_ms": Metric("fwd_ms", "ms", "time"),
               "o_rel_l2": Metric("o_rel_l2", "", "accuracy", bound=1e-2)}

    def side(job_id: int, slow: float) -> JobSide:
        recs = [("fp1", "fwd_ms", 0, i, float(v)) for i, v in enumerate(rng.normal(10 * slow, 0.1, 20))]
        recs += [("fp1", "o_rel_l2", 0, 0, 1e-3), ("fp2", "fwd_ms", 0, 0, 5.0),
                 ("fp2", "o_rel_l2", 0, 0, 1e-3)]
        cases = {"fp1": CaseInfo("fp1", "a"), "fp2": CaseInfo("fp2", "b")}
        return JobSide(JobRef(job_id, "s", "quick"), cases, metrics, SampleTable.from_records(recs))

    cmp = compare(side(1, 1.0), side(2, 1.3))
    rows = views.compare_rows(cmp, "changes")
    assert [(r["case"], r["metric"], r["verdict"]) for r in rows] == [
        ("a", "fwd_ms", "regressed"), ("b", "(case)", "unchanged")]
    assert rows[0]["hidden"] == 1 and "2 metric(s) unchanged" in rows[1]["reason"]
    assert rows[0]["ratio"].startswith("1.3") and rows[0]["p"] != "–" and rows[0]["base"].endswith(" ms")
    assert [r["metric"] for r in views.compare_rows(cmp, "regressions")] == ["fwd_ms"]
    assert len(views.compare_rows(cmp, "all")) == 4


def test_memory_near_parity_shows_the_difference() -> None:
    mib = 1024**2
    cell = views.memory_versus(5212 * mib, 5200 * mib, "bytes")
    assert cell.text == "12.0 MiB higher (+0.2%)" and cell.state == "none"
    assert views.memory_versus(100 * mib, 384 * mib, "bytes").text == "3.84× lower"
    assert views.memory_versus(200 * mib, 100 * mib, "bytes").text == "2.00× higher"


def test_p2p_triton_is_measured_against_ulysses_triton_first() -> None:
    def case(name: str, mode: str, backend: str, ms: float) -> C:
        return C(name, {"seq_len": 65536, "mode": mode, "backend": backend},
                 {"layer_ms": M("layer_ms", "time", ms, unit="ms")})

    rows = {r.case: r for r in views.speed_rows([case("uly-tri", "ulysses", "triton", 160.283),
                                                  case("p2p-eager", "p2p", "eager", 900.0),
                                                  case("p2p-tri", "p2p", "triton", 132.973)])}
    assert rows["p2p-tri"].baseline == "vs ulysses (uly-tri)"
    assert rows["p2p-tri"].speedup.text == "+17.0% (no interval)"  # the report's pair: (U − P) / U


def test_the_page_shows_the_backward_estimate_of_its_medians_not_a_stored_one() -> None:
    case = C("p2p", {"mode": "p2p"}, {
        "fwd_ms": M("fwd_ms", "time", 55.7, unit="ms"),
        "fwd_bwd_ms": M("fwd_bwd_ms", "time", 72.81, unit="ms"),
        "bwd_est_ms": M("bwd_est_ms", "time", 23.04, unit="ms"),  # a per-rank difference, reduced afterwards
    })
    rows = {r.metric: r for r in views.speed_rows([case])}
    assert list(rows) == ["fwd_ms", "fwd_bwd_ms", views.BWD_ESTIMATE]
    assert rows[views.BWD_ESTIMATE].median.text == fmt(72.81 - 55.7, "ms") == "17.11 ms"


def test_untracked_peak_memory_is_not_zero() -> None:
    case = C("cpu", {}, {
        "peak_allocated_bytes": M("peak_allocated_bytes", "memory", 0.0, unit="bytes"),
        "trace_bytes": M("trace_bytes", "memory", 2048.0, 2048.0, 2048.0, unit="bytes"),
    })
    rows = {r.metric: r for r in views.memory_rows([case], tracked=False)}
    assert rows["peak_allocated_bytes"].value.text == "not tracked"
    assert rows["trace_bytes"].value.text == "2.0 KiB"  # a file's size is a reading on any device
    assert views.memory_rows([case])[0].value.text == "0.0 MiB"  # tracked: a real zero
