"""`stability`: each distributed mode's consecutive forward+backward passes: order checks,
finiteness, the pass time and the memory growth from pass 2 to the last."""

from __future__ import annotations

from service.presentation import conventions as cv
from service.presentation.report_cells import case_link, mark, median, memory, ms, rows_of, worst
from service.presentation.report_model import Section, SuiteInput, SuiteReport, Table


def report(inp: SuiteInput) -> SuiteReport:
    rows, passes = [], []
    for j, v in rows_of(inp.mine):
        ms_, tracked = v.metrics, cv.memory_tracked(j.device)
        done, finite, order = ms_.get("passes_done"), ms_.get("finite"), ms_.get("order_checks")
        growth = ms_.get("memory_growth_bytes")
        if done is not None:
            passes.append(int(done.worst))
        error = (v.case.error or "").strip().splitlines()
        rows.append(
            [
                f"CP{j.world_size}",
                case_link(str(v.params.get("mode", v.case.name)), j, v, inp.links),
                "–" if done is None else f"{done.worst:.0f}",
                "–" if finite is None else ("yes" if finite.worst == 1.0 else "NO ✗"),
                "–" if order is None else f"{order.worst:.0f}",
                ms(median(ms_.get("pass_ms"))),
                memory(growth, tracked) + mark(growth, worst(growth) if tracked else None),
                f"error: {error[-1][:120]}" if error else (v.case.status or "–"),
            ]
        )
    out = SuiteReport()
    if rows:
        head = (
            "Consecutive forward+backward passes per mode: P2P order checks, NaN/Inf, the median pass "
            "time (ms) and the peak growth from pass 2 to the last (bound 1 MiB)."
        )
        header = [
            "topology",
            "mode",
            "passes",
            "all finite",
            "order checks",
            "pass median (ms)",
            "memory growth",
            "outcome",
        ]
        out.sections.append(Section("stability", "Stability", [head, Table(header, rows, keys=2)]))
        if passes:
            out.conclusions.append(
                f"Stability: {min(passes)}–{max(passes)} consecutive passes per mode and world size."
                if min(passes) != max(passes)
                else f"Stability: {passes[0]} consecutive passes per mode and world size."
            )
    return out
