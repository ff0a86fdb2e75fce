"""The pivoted tables (the generic report section's, the job page's) on jobs real suites produced,
stored through the dispatcher's sink.

Two runs kept under benchmarks/results: the cp-layer suite on two H200s (Ulysses, P2P and
AllGather at 16K/64K and the B=2 8192/7777 padding case) and the cp-layer quick preset on two
CPU ranks (16 cases). The expected numbers are recomputed here from the runs' raw samples.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from service.domain.baselines import job_repetitions
from service.persistence import summaries as summary_store
from service.presentation import report_tables
from service.presentation.numbers import fmt
from service.presentation.report import build_report
from service.presentation.report_generic import pivot_table
from service.presentation.report_markdown import table_markdown
from service.presentation.report_model import Links, SuiteInput
from tests.support.paths import RESULTS
from tests.support.run_json import store_run

pytestmark = pytest.mark.stores("sqlite")  # the `engine` of these tests is a SQLite file

H200 = RESULTS / "cp_layer_cp2_h200x2.json"
QUICK = RESULTS / "cp_layer_quick_cpu_w2.json"


def report(engine, run: Path, tmp_path: Path) -> tuple[int, dict[str, list[str]]]:
    """The stored job's pivots as Markdown lines (the generic section's tables): the CP timings
    (every mode but the no-CP layer) and the accuracy matrix."""
    job = store_run(engine, run)
    with Session(engine) as s:
        cases = summary_store.case_summaries(s, job)
        values_of = job_repetitions(s, job)
    inp = SuiteInput("cp-layer", [], Links("http://svc"))
    cp = [c for c in cases if c.params.get("mode") != "none"]
    device = json.loads(run.read_text())["device"]
    pivots = {"CP tables": report_tables.timing_pivot(cp, tracked=run != QUICK, values_of=values_of,
                                                      device=device),
              "GDN accuracy matrix": report_tables.accuracy_pivot(cases)}
    return job, {k: table_markdown(pivot_table(p, job, inp)) for k, p in pivots.items()}


def section(md: dict[str, list[str]], title: str) -> list[str]:
    return md[title]


def table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    rows = [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines if ln.startswith("| ")]
    return rows[0], rows[1:]


def point(cell: str) -> str:
    """A gain or speed-up cell's point value: '~ +3.1% [-4.0, +9.9]' -> '+3.1%' (the interval
    after it, '~' before it when the interval does not support a claim)."""
    assert re.fullmatch(r"(~ )?\S+ \[\S+, \S+\]", cell), cell
    return cell.removeprefix("~ ").split(" [")[0]


def worst_rank_median(run: Path, case: str, metric: str) -> float:
    """Slowest rank per repetition, then the median: the report's timing statistic."""
    per_idx: dict[int, float] = defaultdict(lambda: -np.inf)
    for s in json.loads(run.read_text())["samples"]:
        if s["case"] == case and s["metric"] == metric:
            per_idx[s["idx"]] = max(per_idx[s["idx"]], s["value"])
    return float(np.median(list(per_idx.values())))


def test_cp_tables_pivot_a_real_h200_job(engine, tmp_path: Path) -> None:
    job, md = report(engine, H200, tmp_path)
    head, rows = table(section(md, "CP tables"))
    assert head == ["mode", "backend", "T", "B", "valid", "fwd", "fwd+bwd", "bwd estimate", "peak alloc",
                    "peak reserved", "chain wait", "gain vs ulysses", "peak alloc vs ulysses"]
    assert len(rows) == 8  # one row per case: mode x length x padding case
    col = {h: i for i, h in enumerate(head)}
    by = {(r[col["mode"]].split("]")[0].lstrip("["), r[col["T"]], r[col["valid"]]): r for r in rows}
    for T, case in (("16K", "T16384_B1"), ("64K", "T65536_B1"), ("8K", "T8192_B2_valid7777")):
        valid = "7777" if "valid" in case else "–"
        u = worst_rank_median(H200, f"ulysses_triton_{case}", "fwd_bwd_ms")
        p = worst_rank_median(H200, f"p2p_triton_{case}", "fwd_bwd_ms")
        gain = point(by[("p2p", T, valid)][col["gain vs ulysses"]])
        assert gain == f"{(u - p) / u:+.1%}", case  # time saved
        assert by[("ulysses", T, valid)][col["gain vs ulysses"]] == "–"
        assert by[("p2p", T, valid)][col["fwd+bwd"]] == f"{p:.4g} ms"
        # the backward estimate is the difference of the two medians shown beside it
        f = worst_rank_median(H200, f"p2p_triton_{case}", "fwd_ms")
        assert by[("p2p", T, valid)][col["bwd estimate"]] == fmt(p - f, "ms"), case
    # AllGather runs on eager, Ulysses on Triton: no same-backend baseline, no made-up gain
    assert all(r[col["gain vs ulysses"]] == "–" for k, r in by.items() if k[0] == "all_gather")
    assert by[("p2p", "16K", "–")][col["peak alloc"]].endswith("GiB")
    # one link per row, to its case on the job page
    assert all(re.fullmatch(rf"\[\w+\]\(http://svc/jobs/{job}#case-[0-9a-f]+\)", r[0]) for r in rows)

    head, rows = table(section(md, "GDN accuracy matrix"))
    assert head[5:8] == ["output", "input grad", "param grads"] and head[-1] == "finite"
    assert len(rows) == 6  # the 64K cases measure speed only
    # the input gradient of the bf16 layer is above the 1e-2 bound on every candidate: marked
    assert all("✗" in r[head.index("input grad")] for r in rows)
    assert all("✗" not in r[head.index("output")] for r in rows)


def test_a_cp_layer_quick_job_pivots_and_its_report_names_the_skipped_case(engine, tmp_path: Path) -> None:
    job, md = report(engine, QUICK, tmp_path)
    counts = json.loads(QUICK.read_text())["case_counts"]
    ran, skipped = counts["passed"], counts["skipped"]
    head, rows = table(section(md, "CP tables"))
    cp_rows = ran - 1  # every case that ran but the no-CP packed one
    assert head[:6] == ["mode", "P", "T", "B", "valid", "dtype"] and len(rows) == cp_rows
    col = {h: i for i, h in enumerate(head)}
    for r in rows:
        mode = r[0].split("]")[0].lstrip("[")
        gain = r[col["gain vs ulysses"]]
        # P2P and AllGather have a Ulysses row of the same shape and dtype; the one-process P2P
        # emulation (P=4) has none on two ranks
        assert (gain == "–") == (mode in ("ulysses", "p2p_emulated")), (mode, gain)
    head, rows = table(section(md, "GDN accuracy matrix"))
    assert len(rows) == ran and all(r[-1] == "yes" for r in rows)
    fp64 = [r for r in rows if r[col["dtype"]] == "float64"]
    # fp64 CP equals the no-CP layer to rounding (bound 1e-9)
    assert fp64 and all(float(r[head.index("fp64 worst")]) < 1e-9 for r in fp64)
    # the one case that does not apply (AllGather over a packing that crosses a rank boundary) is
    # named in the report with its reason, not as a failure
    with Session(engine) as s:
        text, _ = build_report(s, [job])
    assert skipped == 1 and "1 case(s) did not apply:" in text and "not applicable" in text
    assert "Every bound holds; no case errored." in text


def _metric(name: str, kind: str, median: float, unit: str = "ms", bound: float | None = None) -> Any:
    from workers.stats import MetricStats

    return MetricStats(name, unit, kind, "lower", bound, 5, 5, 1, median, median, median, median, median,
                       None)


def _case(name: str, params: dict[str, Any], metrics: list[Any]) -> Any:
    from service.persistence.summaries import CaseSummary

    return CaseSummary(0, name, f"fp-{name}", params, "passed", None, None, {m.metric: m for m in metrics})


def test_a_backend_in_the_metric_names_or_in_the_case_gives_the_same_tables() -> None:
    """gdn-op names its backends in the metrics ('triton_fwd_bwd_ms'); a suite may instead make
    the backend a case parameter. The report's tables read the same either way."""
    from service.presentation.report_tables import accuracy_pivot, timing_pivot

    t = {"seq_len": 8192}
    in_names = [_case("T8192", t, [
        _metric("eager_fwd_bwd_ms", "time", 126.5), _metric("triton_fwd_bwd_ms", "time", 10.0),
        _metric("triton_o_rel_l2", "accuracy", 5e-3, "ratio", 1e-2),
        _metric("eager_o_rel_l2", "accuracy", 1e-6, "ratio"),
        _metric("speedup_vs_eager", "time", 12.65, "x"),
    ])]
    in_cases = [
        _case("T8192_eager", {**t, "backend": "eager"}, [
            _metric("fwd_bwd_ms", "time", 126.5), _metric("o_rel_l2", "accuracy", 1e-6, "ratio")]),
        _case("T8192_triton", {**t, "backend": "triton"}, [
            _metric("fwd_bwd_ms", "time", 10.0), _metric("o_rel_l2", "accuracy", 5e-3, "ratio", 1e-2)]),
    ]

    def shape(p: Any) -> list[tuple[Any, ...]]:
        return [(r.dims.get("backend"), *(r.cells[k].text for k, _ in p.columns if k in r.cells))
                for r in p.rows]

    for build in (timing_pivot, accuracy_pivot):
        a, b = build(in_names), build(in_cases)
        assert [label for _, label in a.columns] == [label for _, label in b.columns], build
        assert sorted(shape(a), key=str) == sorted(shape(b), key=str), build
    rows = {r.dims["backend"]: r for r in timing_pivot(in_names).rows}
    assert rows["triton"].cells["speedup"].text == "12.65× (no interval)"
    assert "speedup" not in rows["eager"].cells
