"""The section of a suite that declares none (`service.presentation.suite_sections`): every judged
metric of its jobs in the report's pivoted tables (`service.presentation.report_tables`): the
bounded checks, the accuracy per tensor, the times and memory, the trajectories."""

from __future__ import annotations

from service.presentation import conventions as cv
from service.presentation import report_tables as tables
from service.presentation.report_model import Block, Cell, Section, SuiteInput, SuiteReport, Table
from service.presentation.report_tables import Pivot


def pivot_table(p: Pivot, job_id: int, inp: SuiteInput) -> Table:
    """A pivot as a table: its first dimension links to the case, a cell carries its ✗ mark."""
    rows = []
    for r in p.rows:
        dims: list[Cell | str] = [r.dims[k] for k, _ in p.dims]
        dims[0] = Cell(r.dims[p.dims[0][0]], inp.links.case(job_id, r.fingerprint))
        cells = [
            f"{c.text} {c.mark}".strip() if (c := r.cells.get(k)) is not None else "–" for k, _ in p.columns
        ]
        rows.append([*dims, *cells])
    return Table([label for _, label in p.dims] + [label for _, label in p.columns], rows, keys=len(p.dims))


def report(inp: SuiteInput) -> SuiteReport:
    blocks: list[Block] = []
    for j in inp.mine:
        pivots = [
            tables.check_pivot(j.data.cases),
            tables.accuracy_pivot(j.data.cases),
            tables.timing_pivot(j.data.cases, tracked=cv.memory_tracked(j.device), values_of=j.values,
                                device=j.device),
            tables.trajectory_pivot(j.data.cases),
        ]
        found = [p for p in pivots if p]
        if not found:
            continue
        blocks.append(
            f"Job #{j.job_id} (CP{j.world_size}, {j.data.preset}): every judged metric, the worst "
            "rank's value."
        )
        for p in found:
            blocks.append(pivot_table(p, j.job_id, inp))
            if p.notes:
                blocks.append("; ".join(p.notes) + ".")
    out = SuiteReport()
    if blocks:
        out.sections.append(Section(f"suite-{inp.suite}", f"Suite {inp.suite}", blocks))
    return out
