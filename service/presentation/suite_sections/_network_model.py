"""The network's cross-run analysis: weak scaling at equal local length, the two-point model of
time against layer count (per-layer and fixed cost), and the share of the single layer's P2P
saving (cp-layer at the network's shape) that the whole network keeps."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.presentation import conventions as cv
from service.presentation.estimates import CONFIG, NOT_ZERO, Estimate, estimate
from service.presentation.report_cells import BASE_MODE, length, ms, rows_of, values_of
from service.presentation.report_model import (
    NotRun,
    ReportJob,
    Section,
    SuiteInput,
    Sweep,
    SweepSeries,
    Table,
)
from service.presentation.report_tables import Variant

Row = tuple[ReportJob, Variant]
MODEL_TITLE = "Network per-layer model"
SHARE_TITLE = "Share of the single-layer P2P saving the network keeps"


def layers_of(v: Variant) -> int | None:
    """The decoder layers of a network case: its recorded `model_layers`, else the count a model
    name ends in ('qwen35-8l'); None when neither says."""
    m = v.metrics.get("model_layers")
    if m is not None and m.worst == m.worst:
        return int(m.worst)
    found = re.search(r"(\d+)l$", str(v.params.get("model") or ""))
    return int(found.group(1)) if found else None


def linear_layers_of(v: Variant) -> int | None:
    """The GatedDeltaNet (linear-attention) layers of a network case, as it recorded them."""
    m = v.metrics.get("model_linear_layers")
    return None if m is None or m.worst != m.worst else int(m.worst)


MODEL_FACTS = ("model_layers", "model_linear_layers")


def share_model_facts(rows: Sequence[Row]) -> None:
    """Only the speed cases record their model's layer counts; the other cases of the same job
    and model (trajectories, the deterministic pair) take theirs, so every row names its layers."""

    def model(v: Variant) -> str:
        return json.dumps(
            [v.params.get("model"), v.params.get("model_overrides")], sort_keys=True, default=str
        )

    known = {
        (j.job_id, model(v)): {k: v.metrics[k] for k in MODEL_FACTS}
        for j, v in rows
        if all(k in v.metrics for k in MODEL_FACTS)
    }
    for j, v in rows:
        for k, m in known.get((j.job_id, model(v)), {}).items():
            v.metrics.setdefault(k, m)


def layers_label(v: Variant) -> str:
    n = layers_of(v)
    return str(n) if n is not None else str(v.params.get("model") or "–")


@dataclass(frozen=True)
class Fit:
    """fwd+bwd median = fixed + per_layer × layers through two layer counts of one mode, each
    derived number with its bootstrap interval over the two runs' repetitions."""

    world_size: int
    seq_len: int
    mode: str
    layers: tuple[int, int]
    medians: tuple[float, float]
    samples: tuple[np.ndarray, np.ndarray]  # each run's fwd+bwd repetitions (worst rank)
    extra: tuple[str, ...] = ()  # backend, dtype, batch: a fit joins only runs alike in them

    def slope(self, m: np.ndarray) -> np.ndarray:
        """per layer from medians (..., 2) at (fewer, more) layers."""
        return (m[..., 1] - m[..., 0]) / (self.layers[1] - self.layers[0])

    def intercept(self, m: np.ndarray) -> np.ndarray:
        """fixed from medians (..., 2) at (fewer, more) layers."""
        return m[..., 0] - self.slope(m) * self.layers[0]

    @property
    def per_layer(self) -> Estimate:
        return estimate(self.samples, self.slope)

    @property
    def fixed(self) -> Estimate:
        return estimate(self.samples, self.intercept)


FIT_ALIKE = ("backend", "dtype", "batch_size")


def fits(rows: Sequence[Row]) -> tuple[list[Fit], list[int]]:
    """The two-point model of each (world size, length, mode, and `FIT_ALIKE`) measured at two
    layer counts (the fewest and the most), and the layer counts the rows hold."""
    by: dict[tuple[Any, ...], dict[int, Row]] = {}
    for j, v in rows:
        n = layers_of(v)
        if n is not None and v.params.get("seq_len"):
            extra = tuple(str(v.params.get(k)) for k in FIT_ALIKE)
            key = (j.world_size, int(v.params["seq_len"]), str(v.params.get("mode")), extra)
            by.setdefault(key, {})[n] = (j, v)
    out = []
    for (w, T, mode, extra), at in sorted(by.items()):
        if len(at) >= 2:
            lo, hi = min(at), max(at)
            out.append(
                Fit(
                    w,
                    T,
                    mode,
                    (lo, hi),
                    (at[lo][1].metrics["fwd_bwd_ms"].median, at[hi][1].metrics["fwd_bwd_ms"].median),
                    (values_of(*at[lo], "fwd_bwd_ms"), values_of(*at[hi], "fwd_bwd_ms")),
                    extra,
                )
            )
    return out, sorted({n for at in by.values() for n in at})


def _ms_est(e: Estimate) -> str:
    return e.against_zero(ms)


def _versus(u: Fit, p: Fit, several: bool) -> str:
    """P2P's per-layer and fixed cost against Ulysses' at one shape: the differences U − P, each
    bootstrapped over the four runs."""
    four = (*u.samples, *p.samples)
    where = f" ({', '.join(p.extra)})" if several else ""
    per = estimate(four, lambda m: u.slope(m[..., :2]) - p.slope(m[..., 2:]))
    fixed = estimate(four, lambda m: u.intercept(m[..., :2]) - p.intercept(m[..., 2:]))
    if per.excludes(0.0):
        saved = f"P2P {'saves' if per.value > 0 else 'adds'} per layer: U − P {per.text(ms)} ms"
    else:
        saved = f"the per-layer difference U − P {per.text(ms)} ms is {NOT_ZERO}"
    return (
        f"CP{p.world_size} at {length(p.seq_len)}{where}: per layer P2P {p.per_layer.text(ms)} ms against "
        f"Ulysses' {u.per_layer.text(ms)} ms, so {saved}; fixed U − P {fixed.text(ms)} ms"
        f"{'' if fixed.excludes(0.0) else f', {NOT_ZERO}'}."
    )


def model_section(rows: Sequence[Row]) -> Section | NotRun | None:
    found, counts = fits(rows)
    if not rows:
        return None
    if not found:
        ran = ", ".join(str(n) for n in counts) or "none recorded"
        return NotRun(MODEL_TITLE, f"it needs one shape at two layer counts; the network ran at {ran} layers")
    several = len({f.extra for f in found}) > 1
    table = Table(
        ["topology", "global/local T", "mode", "layers", "fwd+bwd", "per layer", "fixed"],
        [
            [
                f"CP{f.world_size}",
                f"{length(f.seq_len)}/{length(f.seq_len // f.world_size)}",
                f.mode + (f" ({', '.join(f.extra)})" if several else ""),
                f"{f.layers[0]} → {f.layers[1]}",
                f"{ms(f.medians[0])} → {ms(f.medians[1])}",
                _ms_est(f.per_layer),
                _ms_est(f.fixed),
            ]
            for f in found
        ],
        keys=3,
    )
    head = (
        "Two-point model of the fwd+bwd median (ms) against the decoder layer count, checkpoint off: "
        "per layer = (T(more) − T(fewer)) / (layers apart), fixed = T(fewer) − per layer × layers. "
        f"Each derived number is estimate [low, high], its {CONFIG.ci_level:.0%} percentile bootstrap "
        f"interval: each run's repetitions resampled ({CONFIG.bootstrap} resamples, seed {CONFIG.seed}) "
        f"and the number recomputed; where the interval contains zero it is {NOT_ZERO}."
    )
    blocks: list[str | Table] = [head, table]
    by = {(f.world_size, f.seq_len, f.mode, f.extra): f for f in found}
    for f in found:
        u = by.get((f.world_size, f.seq_len, BASE_MODE, f.extra))
        if f.mode == "p2p" and u is not None:
            blocks.append(_versus(u, f, several))
    return Section("network-model", MODEL_TITLE, blocks)


def _pairs(rows: Sequence[Row]) -> dict[tuple[Any, ...], Row]:
    return {(j.job_id, v.params.get("seq_len"), layers_of(v), v.params.get("mode")): (j, v) for j, v in rows}


def _layer_rows(inp: SuiteInput, world_size: int, seq_len: int, net: Variant) -> dict[str, Row]:
    """The cp-layer rows (Ulysses and P2P) at the network's world size and global length, on its
    backend and dtype, batch 1 without padding: the single layer the network is made of."""
    out: dict[str, Row] = {}
    for j, v in rows_of(inp.of("cp-layer")):
        p = v.params
        if (j.world_size, p.get("seq_len")) != (world_size, seq_len) or p.get("shards") or p.get("packed"):
            continue
        if p.get("valid_len") is not None or p.get("batch", 1) != 1 or "fwd_bwd_ms" not in v.metrics:
            continue
        if any(net.params.get(k) not in (None, p.get(k)) for k in ("backend", "dtype")):
            continue
        if p.get("mode") in ("p2p", BASE_MODE):
            out[str(p["mode"])] = (j, v)
    return out


def share_estimates(net_u: Row, net_p: Row, layer_u: Row, layer_p: Row, linear: int) -> tuple[Estimate, ...]:
    """The network's P2P saving U − P, the single layer's, and the share of `linear` single-layer
    savings the network keeps, each of the medians, bootstrapped over the four runs."""
    four = [values_of(*r, "fwd_bwd_ms") for r in (net_u, net_p, layer_u, layer_p)]
    net = estimate(four[:2], lambda m: m[..., 0] - m[..., 1])
    one = estimate(four[2:], lambda m: m[..., 0] - m[..., 1])
    share = estimate(four, lambda m: (m[..., 0] - m[..., 1]) / (linear * (m[..., 2] - m[..., 3])))
    return net, one, share


def share_text(net: Estimate, one: Estimate, share: Estimate, linear: int, layer_job: int) -> str:
    """The share with its interval; not informative where the single layer's saving is not
    distinguishable from zero (the share divides by it) or the share's interval is not finite;
    not distinguishable from zero where its interval contains zero."""
    savings = (
        f"the network saves {net.text(ms)} ms against {linear} GDN layers × {one.text(ms)} ms, the "
        f"layer's saving in cp-layer job #{layer_job}; savings of the medians"
    )
    if not one.excludes(0.0):
        return f"not informative: the single layer's P2P saving {one.text(ms)} ms is {NOT_ZERO}"
    if not share.has_interval:
        return f"not informative: {share.text(cv.percent)} ({savings})"
    if not share.excludes(0.0):
        return f"{share.text(cv.percent)}, {NOT_ZERO} ({savings})"
    return f"{share.text(cv.percent)} ({savings})"


def share_lines(inp: SuiteInput, rows: Sequence[Row]) -> tuple[list[str], NotRun | None]:
    """Per network shape and layer count: the network's P2P saving (U − P of the medians) over
    its GDN layers × the single layer's saving at the same shape, with its bootstrap interval;
    stated as a finding only where that interval supports one (`share_text`)."""
    pairs = _pairs(rows)
    out, missing = [], []
    for (job_id, T, n, mode), (j, p2p) in sorted(pairs.items(), key=lambda x: str(x[0])):
        u = pairs.get((job_id, T, n, BASE_MODE))
        if mode != "p2p" or u is None or not T:
            continue
        where = f"CP{j.world_size} at {length(T)}, {n} layers"
        layer = _layer_rows(inp, j.world_size, int(T), p2p)
        if set(layer) != {"p2p", BASE_MODE}:
            missing.append(f"CP{j.world_size} at {length(T)}")
            continue
        linear = linear_layers_of(p2p)
        if linear is None:
            out.append(f"{SHARE_TITLE}, {where}: not given: the job did not record its GDN layer count.")
            continue
        net, one, share = share_estimates(u, (j, p2p), layer[BASE_MODE], layer["p2p"], linear)
        text = share_text(net, one, share, linear, layer["p2p"][0].job_id)
        out.append(f"{SHARE_TITLE}, {where}: {text}.")
    not_run = None
    if missing and not out:
        not_run = NotRun(
            SHARE_TITLE,
            "no cp-layer Ulysses and P2P cases at the network's shape ("
            + ", ".join(dict.fromkeys(missing))
            + ", batch 1, same backend and dtype)",
        )
    return out, not_run


def layer_sweep(rows: Sequence[Row]) -> Sweep | None:
    """fwd+bwd against the layer count, one line per topology and mode."""
    by: dict[str, dict[float, Any]] = {}
    for j, v in rows:
        n = layers_of(v)
        if n is not None:
            by.setdefault(f"CP{j.world_size} {v.params.get('mode')}", {})[float(n)] = v.metrics["fwd_bwd_ms"]
    if not any(len(at) > 1 for at in by.values()):
        return None
    series = [
        SweepSeries(
            name,
            sorted(at),
            [at[x].median for x in sorted(at)],
            [at[x].min for x in sorted(at)],
            [at[x].p90 for x in sorted(at)],
        )
        for name, at in sorted(by.items())
    ]
    return Sweep("network-layers", "Network fwd+bwd against the layer count", "decoder layers", "ms", series)
