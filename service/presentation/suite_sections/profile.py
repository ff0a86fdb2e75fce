"""`profile`: one trace per mode, linked, with what the trace says about communication: the time
communicating and computing, the share of the communication that ran under compute, and each
collective family's time and calls (the worst rank's, as the profile suite recorded them)."""

from __future__ import annotations

from service.presentation.report_cells import ms, rows_of
from service.presentation.report_model import Cell, NotRun, Section, SuiteInput, SuiteReport, Table
from workers.suites.profile.trace import FAMILIES, OTHER

TITLE = "Profile traces"
FAMILY_NAMES = (*(name for name, _ in FAMILIES), OTHER)


def _share(m: object) -> str:
    value = getattr(m, "worst", None)  # the smallest share over the ranks ("higher" is better)
    return "–" if value is None or value != value else f"{value:.0%}"


def report(inp: SuiteInput) -> SuiteReport:
    out = SuiteReport()
    traces, families = [], []
    for j, v in rows_of(inp.mine):
        stem = v.case.name.replace("/", "-")
        names = sorted(a for a in j.artifacts if stem in a)
        mode = str(v.params.get("mode", v.case.name))
        trace = (
            Cell(names[0], inp.links.artifact(j.job_id, names[0]), code=True)
            if names
            else Cell(f"none stored ({v.case.status or 'no result'})")
        )
        ms_ = v.metrics
        events = ms_.get("trace_events")
        traces.append(
            [
                f"CP{j.world_size}",
                mode,
                trace,
                "–" if events is None else f"{events.worst:.0f}",
                ms(_worst(ms_.get("comm_ms"))),
                ms(_worst(ms_.get("compute_ms"))),
                _share(ms_.get("comm_overlap_share")),
            ]
        )
        for f in FAMILY_NAMES:
            spent, calls = ms_.get(f"coll_{f}_ms"), ms_.get(f"coll_{f}_calls")
            if spent is None or calls is None or not calls.worst:
                continue
            families.append(
                [
                    f"CP{j.world_size}",
                    mode,
                    f.replace("_", " "),
                    f"{calls.worst:.0f}",
                    ms(spent.worst),
                    ms(spent.worst / calls.worst),
                ]
            )
    if not traces:
        return out
    head = (
        "One traced forward+backward per mode, not part of the timings; communication and compute are "
        "the union of the trace's collectives and of its compute (device kernels, or host operators "
        "where the trace has none), in ms on the slowest rank; overlap is the share of the "
        "communication that ran under compute (the lowest over the ranks)."
    )
    blocks: list[str | Table] = [
        head,
        Table(["topology", "mode", "trace", "events", "communication", "compute", "overlap"], traces, keys=2),
    ]
    if families:
        blocks += [
            "Collectives by family: calls, their summed time and the time per call (ms, the slowest "
            "rank's sum).",
            Table(["topology", "mode", "collective", "calls", "time", "per call"], families, keys=3),
        ]
    else:
        out.not_run.append(
            NotRun(
                "Collective times and overlap",
                "the traces' jobs recorded no collective "
                "(jobs of the profile suite before it read its traces, or mode none only)",
            )
        )
    out.sections.append(Section("traces", TITLE, blocks))
    return out


def _worst(m: object) -> float | None:
    return getattr(m, "worst", None)
