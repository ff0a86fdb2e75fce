"""`network` on the ranks: a trajectory, speed or determinism case of the network (what each
metric means: `workers.suites.network.spec`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from gdn.device import set_deterministic
from gdn.model import model_config
from workers.context import RankContext
from workers.harness.trajectory import iter_trajectory, run_determinism_pair, step_error
from workers.measure import measure_peak_memory, time_repeats, time_samples
from workers.suite import Case, Sample
from workers.suites.shared.run import case_trainer, token_file_for, trajectory_config, ulysses_misfit_of_model
from workers.suites.shared.spec import PRECISION


def run(ctx: RankContext, case: Case) -> Iterator[Sample]:
    kind = case.params["kind"]
    if kind == "trajectory":
        yield from run_trajectory_case(ctx, case)
    elif kind == "speed":
        yield from run_speed_case(ctx, case)
    else:
        yield from run_determinism_case(ctx, case)


def model_samples(ctx: RankContext, case: Case) -> Iterator[Sample]:
    """The model's decoder and GatedDeltaNet layer counts: the report's per-layer model and the
    share of the single layer's saving read them (the spec cannot: model configs need torch)."""
    cfg = model_config(case.params["model"], **(case.params.get("model_overrides") or {}))
    linear = sum(cfg.layer_type(i) == "linear_attention" for i in range(cfg.num_layers))
    yield Sample(case.name, "model_layers", float(cfg.num_layers), rank=ctx.rank)
    yield Sample(case.name, "model_linear_layers", float(linear), rank=ctx.rank)


def not_applicable(case: Case, world_size: int) -> str | None:
    """Ulysses whose model's GDN heads do not split over the ranks."""
    return ulysses_misfit_of_model(case, world_size)


def reference_file_for(ctx: RankContext, params: Mapping[str, Any]) -> str | None:
    """The job's `reference_file` (kept out of the case parameters, so it never changes a case's
    fingerprint: reading the reference from a file measures the same thing)."""
    return params.get("reference_file") or (ctx.extras.get("params") or {}).get("reference_file")


def run_trajectory_case(ctx: RankContext, case: Case) -> Iterator[Sample]:
    """Samples stream per step: the reference steps while the reference runs (after its broadcast
    on ranks other than 0), then each candidate step with its errors; the maxima and `finite` at
    the end. A NaN/Inf raises NonFiniteTrajectory after the steps before it were yielded."""
    p = case.params
    cfg = trajectory_config(ctx, p)
    prec = PRECISION[cfg.dtype]
    name, r = case.name, ctx.rank
    errors: dict[str, tuple[list[float], list[float]]] = {"loss": ([], []), "grad_norm": ([], [])}
    group = ctx.group if cfg.cp_mode != "none" else None
    steps = iter_trajectory(
        cfg, token_file_for(p), ctx.device, group, reference_file=reference_file_for(ctx, p)
    )
    for ev in steps:
        i = ev.step
        if ev.candidate is None:
            yield Sample(name, "ref_loss", ev.reference.loss, rank=r, idx=i)
            yield Sample(name, "ref_grad_norm", ev.reference.grad_norm, rank=r, idx=i)
            continue
        yield Sample(name, "cand_loss", ev.candidate.loss, rank=r, idx=i)
        yield Sample(name, "cand_grad_norm", ev.candidate.grad_norm, rank=r, idx=i)
        for what, (abs_err, rel_err) in errors.items():
            a, b = step_error(getattr(ev.candidate, what), getattr(ev.reference, what))
            abs_err.append(a)
            rel_err.append(b)
            yield Sample(name, f"{prec}_{what}_abs_err", a, rank=r, idx=i)
            yield Sample(name, f"{prec}_{what}_rel_err", b, rank=r, idx=i)
    for what, (abs_err, rel_err) in errors.items():
        yield Sample(name, f"{prec}_{what}_max_abs", max(abs_err), rank=r)
        yield Sample(name, f"{prec}_{what}_max_rel", max(rel_err), rank=r)
    yield Sample(name, "finite", 1.0, rank=r)  # a NaN/Inf raises NonFiniteTrajectory instead


def run_speed_case(ctx: RankContext, case: Case) -> Iterator[Sample]:
    p = case.params
    yield from model_samples(ctx, case)
    trainer = case_trainer(ctx, p)
    batch = trainer.batch(0)

    def fwd() -> None:
        trainer.forward_loss(batch)

    def fwd_bwd() -> None:
        trainer.forward_backward(batch)

    def step() -> None:
        trainer.forward_backward(batch)
        trainer.optimizer.step()

    w, n = p["warmup"], p["repeat"]
    t_fwd = time_repeats(ctx, fwd, warmup=w, repeat=n)
    t_fb = time_repeats(ctx, fwd_bwd, warmup=w, repeat=n)
    t_step = time_repeats(ctx, step, warmup=w, repeat=n)
    yield from time_samples(ctx, case.name, "fwd_ms", t_fwd)
    yield from time_samples(ctx, case.name, "fwd_bwd_ms", t_fb)
    yield from time_samples(ctx, case.name, "step_ms", t_step)
    mem = measure_peak_memory(ctx, step, incremental=False)
    if mem.tracked:  # a CPU keeps no allocator statistics: no sample rather than a 0
        yield Sample(case.name, "peak_allocated_bytes", float(mem.peak_allocated), rank=ctx.rank)
        yield Sample(case.name, "peak_reserved_bytes", float(mem.peak_reserved), rank=ctx.rank)


def run_determinism_case(ctx: RankContext, case: Case) -> Iterator[Sample]:
    p = case.params
    cfg = trajectory_config(ctx, p, steps=p["determinism_steps"])
    was_on = torch.are_deterministic_algorithms_enabled()
    set_deterministic(ctx.device_kind, True)
    try:
        res = run_determinism_pair(
            cfg, token_file_for(p), ctx.device, ctx.group if cfg.cp_mode != "none" else None
        )
    finally:
        set_deterministic(ctx.device_kind, was_on)
    r = ctx.rank
    yield Sample(case.name, "det_loss_identical", float(res.losses_identical), rank=r)
    yield Sample(case.name, "det_grad_norm_identical", float(res.grad_norms_identical), rank=r)
    yield Sample(case.name, "det_params_identical", float(res.params_identical), rank=r)
    yield Sample(case.name, "det_max_param_diff", res.max_param_diff, rank=r)
    for i, (a, b) in enumerate(zip(res.off, res.full, strict=True)):
        yield Sample(case.name, "ref_loss", a.loss, rank=r, idx=i)
        yield Sample(case.name, "cand_loss", b.loss, rank=r, idx=i)
