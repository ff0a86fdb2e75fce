"""The network under CP on 2 gloo ranks (tiny model, fp32, eager), all in one spawn of the ranks.

One rank function does every distributed check (spawning the ranks costs more than most checks):
- model-level: logits and the summed parameter gradients of every CP mode equal the no-CP model
  (full attention alone exactly; the hybrid model to fp32 rounding);
- the `network` suite's trajectory cases (Ulysses, P2P, AllGather, FSDP over the CP group,
  20 steps, tail padding in one row) against the single-device reference; its determinism pair
  (checkpoint off vs full, bit-identical); a speed case;
- the `stability` suite on every mode; the `profile` suite's trace for one mode;
- bad inputs (sequence not divisible by the CP size, NaN weights) fail on every rank, no hang.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.dist_harness import run_distributed

pytestmark = pytest.mark.slow  # one multi-process run of about a minute (several under load)

MODES = ("ulysses", "p2p", "all_gather")
WORLD = 2


def _ctx(rank: int, world: int, artifacts: Path | None = None):  # -> RankContext
    import torch.distributed as dist

    from workers.context import RankContext

    return RankContext(rank=rank, world_size=world, device=torch.device("cpu"), device_kind="cpu",
                       group=dist.group.WORLD, artifacts_dir=artifacts)


def _samples(suite: Any, ctx: Any, case: Any) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for s in suite.run(ctx, case):
        assert s.case == case.name
        suite.metric(s.metric)  # every sample is of a declared metric
        out.setdefault(s.metric, []).append(s.value)
    return out


def _model_equality(rank: int, world: int) -> dict[str, Any]:
    """Logits and summed gradients of each CP mode against the no-CP model, same weights/inputs."""
    import torch.distributed as dist

    from gdn.model import build_model, model_config
    from gdn.parallel import make_cp

    out: dict[str, Any] = {}
    T = 64
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 257, (2, T), generator=gen)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 45:] = 0  # the padding boundary falls inside rank 1's shard
    lo, hi = rank * T // world, (rank + 1) * T // world
    variants = {"attention": model_config("tiny", layer_types=("full_attention",) * 2, num_layers=2),
                "hybrid": model_config("tiny")}
    for vname, cfg in variants.items():
        ref = build_model(cfg, seed=3)
        ref_logits = ref(ids, mask)
        (ref_logits * mask[..., None]).square().sum().backward()
        # full attention all-gathers K/V the same way in every mode: one mode checks it alone
        for mode in MODES if vname == "hybrid" else ("p2p",):
            model = build_model(cfg, seed=3, cp=make_cp(mode))
            logits = model(ids[:, lo:hi], mask[:, lo:hi])
            (logits * mask[:, lo:hi, None]).square().sum().backward()
            worst = 0.0
            for p, q in zip(model.parameters(), ref.parameters(), strict=True):
                g = p.grad.clone()
                dist.all_reduce(g)
                worst = max(worst, float((g - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)))
            out[f"{vname}/{mode}"] = {
                "logits_max_abs": float((logits - ref_logits[:, lo:hi]).detach().abs().max()),
                "grad_max_rel": worst,
            }
    return out


def _rank_all(rank: int, world: int) -> dict[str, Any]:
    from workers.registry import get_suite

    torch.manual_seed(0)
    out: dict[str, Any] = {"timings": {}}
    t = time.perf_counter()
    out["model"] = _model_equality(rank, world)
    out["timings"]["model"] = time.perf_counter() - t

    network = get_suite("network")
    params = network.resolve_params("quick")
    cases = {c.name: c for c in network.cases(params)}
    ctx = _ctx(rank, world)
    # checkpoint full is covered by the determinism pair: bit-identical to checkpoint off, which
    # matches the reference here
    for case in (cases[f"traj/{m}/ckpt-off"] for m in MODES):
        t = time.perf_counter()
        out[case.name] = _samples(network, ctx, case)
        out["timings"][case.name] = time.perf_counter() - t
    t = time.perf_counter()
    out["determinism"] = _samples(network, ctx, cases["determinism/p2p"])
    out["timings"]["determinism"] = time.perf_counter() - t
    speed = cases["speed/p2p/ckpt-full"]
    speed = type(speed)(speed.suite, speed.name, {**speed.params, "warmup": 1, "repeat": 2})
    out["speed"] = _samples(network, ctx, speed)

    stability = get_suite("stability")
    t = time.perf_counter()
    for case in stability.cases(stability.resolve_params("quick")):
        out[case.name] = _samples(stability, ctx, case)
    out["timings"]["stability"] = time.perf_counter() - t

    profile = get_suite("profile")
    with tempfile.TemporaryDirectory() as d:
        pcase = next(c for c in profile.cases(profile.resolve_params("quick")) if c.name == "trace/p2p")
        out["profile"] = _samples(profile, _ctx(rank, world, Path(d)), pcase)
        out["profile_files"] = sorted(p.name for p in Path(d).iterdir())

    out["errors"] = _bad_inputs(rank, world)
    return out


def _bad_inputs(rank: int, world: int) -> dict[str, str]:
    """Each bad input raises the same clear error on every rank (so no rank waits forever)."""
    from gdn.data import build_sample_token_file
    from workers.harness.trajectory import (
        NonFiniteTrajectory,
        TrajectoryConfig,
        candidate_trainer,
        run_steps,
        run_trajectory,
    )

    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.bin"
        build_sample_token_file(path)
        try:
            run_trajectory(TrajectoryConfig(cp_mode="p2p", seq_len=129, steps=1), path, torch.device("cpu"))
        except ValueError as exc:
            errors["indivisible"] = str(exc)
        nan_cfg = TrajectoryConfig(cp_mode="ulysses", steps=3, lr=1e30)  # diverges at step 1
        try:
            run_trajectory(nan_cfg, path, torch.device("cpu"))  # the reference fails on rank 0 only
        except NonFiniteTrajectory as exc:
            errors["nan_reference"] = str(exc)
        try:
            run_steps(candidate_trainer(nan_cfg, path, torch.device("cpu"), None), 2, "candidate")
        except NonFiniteTrajectory as exc:
            errors["nan_candidate"] = str(exc)
    return errors


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_distributed(_rank_all, WORLD, timeout_s=600)


@pytest.mark.parametrize("mode", MODES)
def test_full_attention_and_model_under_cp_equal_no_cp(results: list[dict[str, Any]], mode: str) -> None:
    for r in results:
        attn, hybrid = r["model"]["attention/p2p"], r["model"][f"hybrid/{mode}"]
        assert attn["logits_max_abs"] <= 1e-6, attn
        assert attn["grad_max_rel"] <= 1e-5, attn
        assert hybrid["logits_max_abs"] <= 1e-5, hybrid
        assert hybrid["grad_max_rel"] <= 1e-4, hybrid


@pytest.mark.parametrize("case", [f"traj/{m}/ckpt-off" for m in MODES])
def test_trajectory_matches_reference(results: list[dict[str, Any]], case: str) -> None:
    for r in results:
        s = r[case]
        assert len(s["fp32_loss_rel_err"]) == 20 and len(s["ref_loss"]) == 20
        assert s["fp32_loss_max_rel"][0] <= 1e-5
        assert s["fp32_grad_norm_max_rel"][0] <= 1e-4
        assert max(s["fp32_loss_rel_err"]) == s["fp32_loss_max_rel"][0]
        # max abs and max rel are recorded independently
        assert s["fp32_loss_max_abs"][0] == max(s["fp32_loss_abs_err"])
        assert s["finite"] == [1.0]
        # the learning rate is real: the loss moves, and every step saw a different batch
        assert s["ref_loss"][-1] < s["ref_loss"][0] - 0.1
        assert len(set(s["ref_loss"])) == 20
    # every rank reports the same global numbers
    assert results[0][case]["cand_loss"] == results[1][case]["cand_loss"]


def test_determinism_pair_bit_identical(results: list[dict[str, Any]]) -> None:
    for r in results:
        d = r["determinism"]
        assert d["det_loss_identical"] == [1.0]
        assert d["det_grad_norm_identical"] == [1.0]
        assert d["det_params_identical"] == [1.0]
        assert d["det_max_param_diff"] == [0.0]
        assert len(d["ref_loss"]) == 10 and d["ref_loss"] == d["cand_loss"]


def test_speed_case_reports_every_repetition(results: list[dict[str, Any]]) -> None:
    for r in results:
        s = r["speed"]
        assert len(s["fwd_ms"]) == len(s["fwd_bwd_ms"]) == len(s["step_ms"]) == 2
        assert (s["model_layers"], s["model_linear_layers"]) == ([4.0], [3.0])  # tiny: 3 GDN layers of 4
        assert all(v > 0 for v in s["fwd_ms"] + s["fwd_bwd_ms"] + s["step_ms"])
        # a CPU keeps no allocator statistics: no memory sample, rather than a 0 read as a measurement
        assert "peak_allocated_bytes" not in s and "peak_reserved_bytes" not in s


@pytest.mark.parametrize("mode", MODES)
def test_stability(results: list[dict[str, Any]], mode: str) -> None:
    from workers.registry import get_suite

    suite = get_suite("stability")
    for r in results:
        s = r[f"passes/{mode}"]
        assert s["passes_done"] == [20.0]
        assert s["finite"] == [1.0] * 20
        assert all(suite.metric(name).passes(v) for name, vs in s.items() for v in vs)
        assert "memory_growth_bytes" not in s and "peak_allocated_bytes" not in s  # not tracked on a CPU
        if mode == "p2p":
            assert s["order_checks"][0] > 0  # the state chain's messages were order-checked


def test_profile_trace_is_an_artifact(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert r["profile_files"] == ["trace-p2p.trace.json.gz"]
        assert r["profile"]["trace_written"] == [1.0]
        assert r["profile"]["trace_events"][0] > 10
        # read back from the trace: the state chain's sends and receives, and FSDP's gathers
        prof = r["profile"]
        assert prof["coll_send_recv_calls"][0] >= 2 and prof["coll_all_gather_calls"][0] >= 1
        families = sum(v[0] for k, v in prof.items() if k.startswith("coll_") and k.endswith("_ms"))
        assert 0 < prof["comm_ms"][0] <= families + 1e-9  # the union of overlapping collectives
        assert 0.0 <= prof["comm_overlap_share"][0] <= 1.0 and prof["compute_ms"][0] > 0


def test_bad_inputs_fail_on_every_rank(results: list[dict[str, Any]]) -> None:
    for r in results:
        e = r["errors"]
        assert "sequence length 129 is not divisible by the CP size 2" in e["indivisible"]
        assert "reference step 1" in e["nan_reference"] and "expected finite" in e["nan_reference"]
        assert "candidate step 1" in e["nan_candidate"]


def test_timings_recorded(results: list[dict[str, Any]]) -> None:
    """Not a speed bound: prints where the module's time goes (pytest -s shows it)."""
    print({k: round(v, 1) for k, v in results[0]["timings"].items()})
    assert all(v > 0 for v in results[0]["timings"].values())
