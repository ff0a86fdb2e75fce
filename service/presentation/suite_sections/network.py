"""`network`: the whole hybrid network with FSDP over the CP group: trajectories against the
reference, speed and memory with the gain over Ulysses, weak scaling, the per-layer model and
the share of the single layer's saving it keeps, activation checkpoint off against full, and
the deterministic pair."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from service.domain.compare.judgment import Difference
from service.presentation import conventions as cv
from service.presentation import views
from service.presentation.numbers import fmt
from service.presentation.report_cells import (
    TIMING_HEADER,
    against_ulysses,
    case_link,
    compare,
    counts,
    err,
    gain_text,
    growth_text,
    judged,
    length,
    median,
    memory,
    ms,
    rows_of,
    shape_key,
    timing_cells,
    worst,
)
from service.presentation.report_model import (
    ReportJob,
    Section,
    StepPlot,
    StepSeries,
    SuiteInput,
    SuiteReport,
    Table,
)
from service.presentation.report_tables import Variant
from service.presentation.suite_sections._claims import across_shapes
from service.presentation.suite_sections._network_model import (
    layer_sweep,
    layers_label,
    model_section,
    share_lines,
    share_model_facts,
)
from service.presentation.suite_sections.cp_layer import (
    scaling_conclusions,
    scaling_not_run,
    scaling_table,
    weak_scaling,
)

Row = tuple[ReportJob, Variant]
PRECISIONS = ("bf16", "fp32")


def _prefix(metrics: Mapping[str, Any]) -> str | None:
    """The precision a trajectory case's metric names carry ('bf16_loss_max_rel')."""
    return next(
        (p for p in PRECISIONS if f"{p}_loss_max_rel" in metrics or f"{p}_loss_rel_err" in metrics), None
    )


def _traj_cells(metrics: Mapping[str, Any], prefix: str, what: str) -> list[str]:
    ref = metrics.get(f"ref_{what}")
    max_abs = metrics.get(f"{prefix}_{what}_max_abs") or metrics.get(f"{prefix}_{what}_abs_err")
    max_rel = metrics.get(f"{prefix}_{what}_max_rel") or metrics.get(f"{prefix}_{what}_rel_err")
    per_step = metrics.get(f"{prefix}_{what}_rel_err")
    return [
        f"[{fmt(ref.min)}, {fmt(ref.max)}]" if ref is not None else "–",
        err(worst(max_abs)),
        judged(max_rel),
        err(None if per_step is None else per_step.mean),
    ]


def _case_label(v: Variant) -> str:
    return f"{v.params.get('mode')}, ckpt {v.params.get('checkpoint')}"


def trajectories(inp: SuiteInput, rows: Sequence[Row]) -> Section | None:
    traj = [(j, v) for j, v in rows if v.params.get("kind") == "trajectory" and _prefix(v.metrics)]
    if not traj:
        return None
    tables: dict[str, list[list[Any]]] = {"loss": [], "grad_norm": []}
    for j, v in sorted(traj, key=lambda r: (r[0].world_size, layers_label(r[1]), _case_label(r[1]))):
        prefix = _prefix(v.metrics)
        assert prefix is not None
        steps = v.metrics.get("ref_loss") or v.metrics.get(f"{prefix}_loss_rel_err")
        keys = [
            f"CP{j.world_size}",
            layers_label(v),
            case_link(_case_label(v), j, v, inp.links),
            str(steps.count if steps else "–"),
        ]
        for what in tables:
            tables[what].append([*keys, *_traj_cells(v.metrics, prefix, what)])
    head = (
        "Candidate against the reference per optimizer step: the reference's range [min, max], the "
        "largest absolute and relative differences (possibly at different steps) and the mean relative "
        "difference."
    )
    key_header = ["topology", "layers", "mode", "steps"]
    return Section(
        "trajectories",
        "Network trajectories",
        [
            head,
            *(
                Table(
                    [
                        *key_header,
                        f"{label} ref range",
                        f"{label} max abs",
                        f"{label} max rel",
                        f"{label} mean rel",
                    ],
                    tables[what],
                    keys=4,
                )
                for what, label in (("loss", "loss"), ("grad_norm", "grad-norm"))
            ),
        ],
    )


def trajectory_plots(rows: Sequence[Row]) -> list[StepPlot]:
    """One plot per quantity (loss, grad-norm): the candidate's relative difference per step of
    every trajectory case of the report, overlaid."""
    out = []
    for what, label in (("loss", "loss"), ("grad_norm", "grad-norm")):
        series = []
        for j, v in rows:
            prefix = _prefix(v.metrics) if v.params.get("kind") == "trajectory" else None
            if prefix is None:
                continue
            name = f"{prefix}_{what}_rel_err"
            steps, values = j.steps(v.case.fingerprint, name)
            if steps.size:
                m = v.metrics.get(name)
                series.append(
                    StepSeries(
                        f"CP{j.world_size} {layers_label(v)}L {_case_label(v)}",
                        steps,
                        values,
                        None if m is None else m.bound,
                    )
                )
        if series:
            out.append(
                StepPlot(f"trajectory-{what}", f"Network {label}: relative difference per step", "", series)
            )
    return out


def _speed_rows(rows: Sequence[Row]) -> list[Row]:
    return [(j, v) for j, v in rows if v.params.get("kind") == "speed" and "fwd_bwd_ms" in v.metrics]


def _global_local(j: ReportJob, v: Variant) -> str:
    T = v.params.get("seq_len")
    return f"{length(T)}/{length(T // j.world_size)}" if isinstance(T, int) and j.world_size else "–"


def speed(inp: SuiteInput, rows: Sequence[Row], gains: dict[int, Difference]) -> Section | None:
    if not rows:
        return None
    out = []
    for j, v in sorted(
        rows,
        key=lambda r: (
            layers_label(r[1]),
            r[0].world_size,
            r[1].params.get("seq_len") or 0,
            str(r[1].params.get("mode")),
        ),
    ):
        tracked = cv.memory_tracked(j.device)
        out.append(
            [
                layers_label(v),
                f"CP{j.world_size}",
                _global_local(j, v),
                case_link(str(v.params.get("mode")), j, v, inp.links),
                *timing_cells(v.metrics.get("fwd_ms"), v.metrics["fwd_bwd_ms"]),
                ms(median(v.metrics.get("step_ms"))),
                memory(v.metrics.get("peak_allocated_bytes"), tracked),
                memory(v.metrics.get("peak_reserved_bytes"), tracked),
                gain_text(gains[id(v)]) if id(v) in gains else "–",
            ]
        )
    reps = counts([v for _, v in rows], ("warmup", "repeat"))
    head = (
        f"Whole network, activation checkpoint off; times in ms ({reps}): median, p90 and min of the "
        "slowest rank per repetition; step = zero_grad + forward + loss + backward + reduce + "
        "optimizer step; gain = time saved against Ulysses, (U − P) / U of the fwd+bwd repetitions, "
        "with its 95% interval."
    )
    header = [
        "layers",
        "topology",
        "global/local T",
        "mode",
        *TIMING_HEADER,
        "step",
        "peak allocated",
        "peak reserved",
        "gain vs Ulysses",
    ]
    return Section("network-speed", "Network speed and memory", [head, Table(header, out, keys=4)])


def checkpoint(
    inp: SuiteInput, rows: Sequence[Row]
) -> tuple[Section | None, list[tuple[str, Difference, float | None]]]:
    """Checkpoint full against off per shape and mode: the time's growth (judged) and the peak's."""
    by = {(j.job_id, shape_key(v, ("checkpoint",)), v.params.get("checkpoint")): (j, v) for j, v in rows}
    pairs = [
        ((j, v), by[(job, shape, "full")])
        for (job, shape, ck), (j, v) in by.items()
        if ck == "off" and (job, shape, "full") in by
    ]
    if not pairs:
        return None, []
    offs, fulls = [off for off, _ in pairs], [full for _, full in pairs]
    g_off, g_full = (
        against_ulysses(offs, ("p2p", "all_gather")),
        against_ulysses(fulls, ("p2p", "all_gather")),
    )
    out, found = [], []
    for (j, off), (jf, full) in sorted(
        pairs, key=lambda p: (layers_label(p[0][1]), p[0][0].world_size, str(p[0][1].params.get("mode")))
    ):
        tracked = cv.memory_tracked(j.device)
        pa, pb = off.metrics.get("peak_allocated_bytes"), full.metrics.get("peak_allocated_bytes")
        peak = cv.growth(pa.worst, pb.worst) if tracked and pa is not None and pb is not None else None
        change = compare(j, off, jf, full)
        found.append((f"CP{j.world_size} {layers_label(off)} layers {off.params.get('mode')}", change, peak))
        out.append(
            [
                layers_label(off),
                f"CP{j.world_size}",
                case_link(str(off.params.get("mode")), j, off, inp.links),
                ms(off.metrics["fwd_bwd_ms"].median),
                ms(full.metrics["fwd_bwd_ms"].median),
                growth_text(change),
                cv.percent(peak, signed=True) if tracked else cv.NOT_TRACKED,
                gain_text(g_off[id(off)]) if id(off) in g_off else "–",
                gain_text(g_full[id(full)]) if id(full) in g_full else "–",
            ]
        )
    header = [
        "layers",
        "topology",
        "mode",
        "fwd+bwd off",
        "fwd+bwd full",
        "time",
        "peak allocated",
        "gain vs Ulysses off",
        "gain vs Ulysses full",
    ]
    head = (
        "Activation checkpoint off against full (each decoder layer): change = (full − off) / off of the "
        "fwd+bwd repetitions (with its 95% interval) and of the peak allocated."
    )
    return Section(
        "checkpoint", "Activation checkpoint off vs full", [head, Table(header, out, keys=3)]
    ), found


def determinism(inp: SuiteInput, rows: Sequence[Row]) -> Section | None:
    out = []
    for j, v in rows:
        if v.params.get("kind") != "determinism":
            continue
        ms_ = v.metrics

        def same(name: str, ms_: Mapping[str, Any] = ms_) -> str:
            m = ms_.get(name)
            return "–" if m is None else ("yes" if m.worst == 1.0 else "NO ✗")

        out.append(
            [
                f"CP{j.world_size}",
                case_link(str(v.params.get("mode")), j, v, inp.links),
                str(v.params.get("determinism_steps", "–")),
                same("det_loss_identical"),
                same("det_grad_norm_identical"),
                same("det_params_identical"),
                judged(ms_.get("det_max_param_diff")),
            ]
        )
    if not out:
        return None
    head = (
        "Deterministic collectives and algorithms: checkpoint off and full must give bit-identical results "
        "step by step."
    )
    header = [
        "topology",
        "mode",
        "steps",
        "loss identical",
        "grad-norm identical",
        "params identical",
        "max param diff",
    ]
    return Section("determinism", "Deterministic pair", [head, Table(header, out, keys=2)])


def _trajectory_lines(rows: Sequence[Row]) -> list[str]:
    out = []
    traj = [v for _, v in rows if v.params.get("kind") == "trajectory" and _prefix(v.metrics)]
    for what, label in (("loss", "loss"), ("grad_norm", "grad-norm")):
        found = []
        for v in traj:
            prefix = _prefix(v.metrics)
            m = v.metrics.get(f"{prefix}_{what}_max_rel") or v.metrics.get(f"{prefix}_{what}_rel_err")
            if m is not None:
                found.append((m.worst, m, v))
        if not found:
            continue
        value, m, v = max(found, key=lambda x: math.inf if x[0] != x[0] else x[0])
        holds = (
            ""
            if m.bound is None
            else (
                (" within its bound " if views.judge(value, m).state != "bad" else " OUTSIDE its bound ")
                + fmt(m.bound)
            )
        )
        out.append(
            f"Network trajectories: worst {label} max relative difference {fmt(value)} "
            f"({_case_label(v)}, {layers_label(v)} layers){holds}."
        )
    return out


def _checkpoint_line(found: Sequence[tuple[str, Difference, float | None]]) -> str | None:
    if not found:
        return None
    times = "; ".join(f"{where} {growth_text(d)}" for where, d, _ in found)
    peaks = [p for _, _, p in found if p is not None]
    lo, hi = (cv.percent(f(peaks), signed=True) for f in (min, max)) if peaks else ("", "")
    peak = f"peak allocated {lo if lo == hi else f'{lo} to {hi}'}" if peaks else "peak allocated not tracked"
    return f"Activation checkpoint full vs off (change = (full − off) / off): fwd+bwd {times}; {peak}."


def report(inp: SuiteInput) -> SuiteReport:
    out = SuiteReport()
    rows = rows_of(inp.mine)
    share_model_facts(rows)
    out.add(trajectories(inp, rows))
    out.plots += trajectory_plots(rows)
    speed_all = _speed_rows(rows)
    off = [(j, v) for j, v in speed_all if v.params.get("checkpoint", "off") == "off"] or speed_all
    gains = against_ulysses(off, ("p2p", "all_gather"))
    out.add(speed(inp, off, gains))
    found, locals_ = weak_scaling(off, ("model", "dtype", "batch_size"))
    if found:
        head = (
            "Weak scaling of the whole network: the same local length per rank on more ranks, checkpoint "
            "off; growth = (after − before) / before of the fwd+bwd repetitions, with its 95% interval."
        )
        table = scaling_table(found, ["layers"], lambda s: [layers_label(s.rows[0][1])])
        out.sections.append(Section("network-scaling", "Network weak scaling", [head, table]))
    elif off:
        out.not_run.append(scaling_not_run("Network weak scaling", locals_))
    if off:
        out.add(model_section(off))
    shares, share_not_run = share_lines(inp, off)
    out.add(share_not_run)
    if (sweep := layer_sweep(off)) is not None:
        out.plots.append(sweep)
    ckpt, ckpt_found = checkpoint(inp, speed_all)
    out.add(ckpt)
    out.add(determinism(inp, rows))
    out.conclusions += _trajectory_lines(rows)
    groups: dict[str, list[tuple[str, Difference]]] = {}
    for j, v in sorted(off, key=lambda r: r[1].params.get("seq_len") or 0):
        if v.params.get("mode") == "p2p" and id(v) in gains:
            groups.setdefault(f"CP{j.world_size}, {layers_label(v)} layers", []).append(
                (length(v.params.get("seq_len")), gains[id(v)])
            )
    for key, xs in sorted(groups.items()):
        out.conclusions.append(
            across_shapes(f"Network {key}, P2P gain over Ulysses", xs, "gain", "P2P faster", "P2P slower")
        )
    out.conclusions += scaling_conclusions(lambda s: f"Network, {layers_label(s.rows[0][1])} layers", found)
    out.conclusions += shares
    if (line := _checkpoint_line(ckpt_found)) is not None:
        out.conclusions.append(line)
    return out
