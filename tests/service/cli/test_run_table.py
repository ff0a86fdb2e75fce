"""`gdnval run`'s tables on a real cp-layer quick run (two CPU ranks, kept under
benchmarks/results): one row per case with its key numbers, the failures-only view, and the
full per-metric table behind a flag."""

from __future__ import annotations

import json
import re

from rich.console import Console

from service.cli.run import CollectingSink, _render
from tests.support.paths import RESULTS
from workers.registry import get_suite
from workers.suite import Sample

RUN = RESULTS / "cp_layer_quick_cpu_w2.json"


def rendered(view: str, failed: str | None = None, width: int | None = None) -> str:
    doc = json.loads(RUN.read_text())
    suite = get_suite("cp-layer")
    cases = suite.cases(suite.resolve_params("quick"))
    sink = CollectingSink()
    sink.samples([Sample(s["case"], s["metric"], float("nan") if s["value"] is None else s["value"],
                         rank=s["rank"], idx=s["idx"]) for s in doc["samples"]])
    for c in doc["cases"]:
        sink.case_result(c["name"], "failed" if c["name"] == failed else c["status"], c["error"])
    console = Console(record=True, width=width or 400, color_system=None)
    _render(console, suite, cases, sink, "cpu", 2, view=view, width=width)
    return console.export_text()


def test_one_row_per_case_with_the_key_numbers_as_columns() -> None:
    text = rendered("cases")
    header = next(ln for ln in text.splitlines() if "case" in ln and "status" in ln)
    for col in ("bounds held", "worst rel-L2", "fwd", "fwd+bwd", "gain"):
        assert col in header, col
    rows = [ln for ln in text.splitlines() if "passed" in ln]
    passed = json.loads(RUN.read_text())["case_counts"]["passed"]
    assert len(rows) == passed > 0  # one per case, where the per-metric table had a row per metric
    p2p = next(ln for ln in rows if "p2p_eager_T128_B1_float32" in ln)
    assert "(cp_worst)" in p2p  # the worst judged tensor named (a diagnostic is never the worst)
    assert "%" in p2p or "×" in p2p  # its gain over the Ulysses row of the same shape
    assert "out of bound" not in header  # nothing broke a bound


def test_failures_view_keeps_only_what_needs_attention() -> None:
    assert "every case passed and every bounded number holds" in rendered("failures")
    text = rendered("failures", failed="ulysses_eager_T128_B1_float64")
    lines = [ln for ln in text.splitlines() if "_eager_T" in ln]
    assert len(lines) == 1 and "failed" in lines[0]


def test_the_full_per_metric_table_stays_behind_a_flag() -> None:
    text = rendered("metrics")
    rows = [ln for ln in text.splitlines() if "fwd_bwd_ms (ms)" in ln]
    assert len(rows) == json.loads(RUN.read_text())["case_counts"]["passed"]
    assert "padding_output_max_abs (abs)" in text


def _with_samples(extra: list[Sample], device: str) -> str:
    """The recorded CPU run, with `extra` samples, rendered as if it ran on `device`."""
    doc = json.loads(RUN.read_text())
    suite = get_suite("cp-layer")
    cases = suite.cases(suite.resolve_params("quick"))
    sink = CollectingSink()
    sink.samples([Sample(s["case"], s["metric"], float("nan") if s["value"] is None else s["value"],
                         rank=s["rank"], idx=s["idx"]) for s in doc["samples"]] + extra)
    for c in doc["cases"]:
        sink.case_result(c["name"], c["status"], c["error"])
    console = Console(record=True, width=400, color_system=None)
    _render(console, suite, cases, sink, device, 2, view="cases")
    return console.export_text()


def test_memory_a_cpu_does_not_track_reads_not_tracked() -> None:
    """A CPU run stores no memory samples; its table says so instead of printing 0 bytes, also
    for a run that stored 0 (as network and stability did on a CPU)."""
    text = rendered("cases")
    assert "MiB" not in text and " B " not in text  # no samples: no memory column at all
    case = "p2p_eager_T128_B1_float32"
    zeros = [Sample(case, "peak_allocated_bytes", 0.0, rank=r) for r in (0, 1)]
    on_cpu = _with_samples(zeros, "cpu")
    row = next(ln for ln in on_cpu.splitlines() if case in ln)
    assert "not tracked" in row and "0.0 MiB" not in on_cpu
    # the device decides: the same stored zero on a GPU is a measured 0 bytes
    assert "0.0 MiB" in next(ln for ln in _with_samples(zeros, "cuda").splitlines() if case in ln)


def test_job_page_memory_rows_read_not_tracked_on_a_cpu() -> None:
    """Zeros stored by an older CPU job read "not tracked" on the job page; on a GPU they are bytes."""
    from service.cli.run import case_stats, metric_stats
    from service.presentation import views
    from service.presentation.conventions import memory_tracked

    doc = json.loads(RUN.read_text())
    suite = get_suite("cp-layer")
    cases = suite.cases(suite.resolve_params("quick"))
    case = "p2p_eager_T128_B1_float32"
    sink = CollectingSink()
    sink.samples([Sample(s["case"], s["metric"], s["value"] or 0.0, rank=s["rank"], idx=s["idx"])
                  for s in doc["samples"]]
                 + [Sample(case, "peak_allocated_bytes", 0.0, rank=r) for r in (0, 1)])
    stats = case_stats(cases, sink, metric_stats(suite, sink.samples_), "cpu", 2)
    rows = views.memory_rows(stats, tracked=memory_tracked("cpu"))
    assert rows and all(r.value.text == "not tracked" for r in rows)
    on_gpu = views.memory_rows(stats, tracked=memory_tracked("cuda"))
    assert on_gpu and all("not tracked" not in r.value.text for r in on_gpu)


def test_gains_carry_their_interval_and_cpu_noise_is_no_finding() -> None:
    """Two CPU ranks time each case a few times: a gain over Ulysses is printed with its interval
    and, on a CPU (raw wall clock, only a doubling counts), never coloured as a finding."""
    text = rendered("cases")
    gains = [m for ln in text.splitlines() if "p2p_" in ln and "passed" in ln
             for m in re.findall(r"(~ )?[+-]\d+\.\d% \[[+-]\d+\.\d, [+-]\d+\.\d\]", ln)]
    assert len(gains) >= 4 and all(m == "~ " for m in gains), text  # none significant on a CPU
    assert "95% bootstrap interval" in text


def test_the_table_fits_a_100_column_terminal() -> None:
    text = rendered("cases", width=100)
    assert max(len(ln.rstrip()) for ln in text.splitlines() if "│" in ln or "┃" in ln) <= 100
    assert "left out to fit 100 columns" in text and "--wide" in text
    header = next(ln for ln in text.splitlines() if "case" in ln and "status" in ln)
    assert "gain" in header and "fwd+bwd" in header  # the numbers a reader acts on stay
