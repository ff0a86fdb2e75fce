"""The `cp-layer` suite: torch-free metadata, the case matrix, and one real 2-rank run of its cases."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.dist_harness import run_distributed


def test_metadata_imports_no_torch() -> None:
    code = (
        "import sys; from workers.registry import get_suite; s = get_suite('cp-layer'); "
        "[s.cases(s.resolve_params(p)) for p in s.presets]; s.describe(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_case_matrix_of_the_presets() -> None:
    from workers.registry import get_suite

    suite = get_suite("cp-layer")
    full = {c.name: c.params for c in suite.cases(suite.resolve_params("full"))}
    for mode, backend in (("ulysses", "triton"), ("p2p", "triton")):
        for T in (8192, 16384, 32768, 65536, 131072):
            assert f"{mode}_{backend}_T{T}_B1" in full
        pad = full[f"{mode}_{backend}_T8192_B2_valid7777"]
        assert (pad["batch"], pad["seq_len"], pad["valid_len"], pad["v_heads"]) == (2, 8192, 7777, 32)
    # AllGather runs eager only, and eager stops at eager_max_seq_len.
    assert {n for n in full if n.startswith("all_gather")} == {
        "all_gather_eager_T8192_B1", "all_gather_eager_T16384_B1", "all_gather_eager_T32768_B1",
        "all_gather_eager_T8192_B2_valid7777", "all_gather_eager_T16384_B1_packed8",
    }
    # one packed 16K batch (8 sequences) under every mode; the no-CP layer on packed batches only
    packed = {n: p for n, p in full.items() if "packed" in p}
    assert set(packed) == {f"{m}_T16384_B1_packed8" for m in
                           ("ulysses_triton", "p2p_triton", "all_gather_eager", "none_triton")}
    assert all(sum(p["packed"]) == p["seq_len"] == 16384 and p["batch"] == 1 for p in packed.values())
    assert [n for n in full if n.startswith("none")] == ["none_triton_T16384_B1_packed8"]
    assert "packed" not in full["p2p_triton_T8192_B1"]  # unpacked cases keep their parameters
    gate = [c.name for c in suite.cases(suite.resolve_params("gate"))]
    assert gate == [
        "p2p_emulated4_triton_T8192_B1", "p2p_emulated8_triton_T8192_B1",
        "p2p_emulated4_triton_T8192_B2_valid7777", "p2p_emulated8_triton_T8192_B2_valid7777",
        "p2p_emulated4_triton_T8192_B1_packed7", "p2p_emulated8_triton_T8192_B1_packed7",
        "none_triton_T8192_B1_packed7",
    ]
    quick = suite.cases(suite.resolve_params("quick"))
    assert len(quick) == 21 and {c.params["dtype"] for c in quick} == {"float64", "float32"}
    packed = [c for c in quick if "packed" in c.params]  # 5 candidates, fp64 only (packed_dtypes)
    assert len(packed) == 5 and {c.params["dtype"] for c in packed} == {"float64"}
    with pytest.raises(ValueError, match="bad candidate 'ring\\+eager'"):
        suite.cases(suite.resolve_params("quick", {"candidates": ["ring+eager"]}))
    # the backends whose provenance the ranks record: every candidate's and the reference's
    assert suite.backends(suite.resolve_params("full")) == ("triton", "eager")
    assert suite.backends(suite.resolve_params("quick", {"candidates": ["p2p+a.b:c"]})) == ("a.b:c", "eager")
    with pytest.raises(ValueError, match=r"packed_dtypes \['bfloat16'\] must be some of the dtypes"):
        suite.cases(suite.resolve_params("quick", {"packed_dtypes": ["bfloat16"]}))
    assert suite.cases(suite.resolve_params("quick", {"dtypes": ["float32"], "packed_cases": []}))
    with pytest.raises(ValueError, match="named twice: packed_cases"):
        suite.cases(suite.resolve_params("quick", {"packed_cases": [[100, 60], [60, 100]]}))


def test_all_gather_over_a_packing_crossing_a_rank_boundary_is_not_applicable() -> None:
    """AllGather cannot carry a sequence's state over a rank boundary: such a packed case is
    skipped at that world size with the sequence and boundary named; P2P and Ulysses run it, and
    AllGather runs a packing whose rank boundaries are all sequence boundaries."""
    from workers.registry import get_suite

    suite = get_suite("cp-layer")
    cases = {c.name: c for c in suite.cases(suite.resolve_params("quick"))}
    ag = cases["all_gather_eager_T160_B1_packed4_float64"]  # offsets 0, 1, 64, 129, 160
    for world, seq, edge in ((2, "2 (tokens [64, 129))", 80), (4, "1 (tokens [1, 64))", 40),
                             (8, "1 (tokens [1, 64))", 20)):  # the first crossing is named
        why = suite.not_applicable(ag, world) or ""
        assert f"sequence {seq}" in why and f"boundary at token {edge} " in why, why
    for name in ("p2p_eager_T160_B1_packed4_float64", "ulysses_eager_T160_B1_packed4_float64"):
        assert suite.not_applicable(cases[name], 4) is None
    aligned = suite.cases(suite.resolve_params("quick", {"packed_cases": [[40, 40, 20, 20, 40]],
                                                         "candidates": ["all_gather+eager"]}))
    assert [suite.not_applicable(c, 4) for c in aligned if "packed" in c.params] == [None]


def test_emulated_case_in_one_process_and_distributed_modes_need_ranks(one_torch_thread: None) -> None:
    import torch

    from gdn.cp import CPError
    from workers.context import RankContext
    from workers.registry import get_suite

    suite = get_suite("cp-layer")
    cases = {c.name: c for c in suite.cases(suite.resolve_params("quick"))}
    ctx = RankContext(0, 1, torch.device("cpu"), "cpu", seed=3)
    for name in ("p2p_emulated4_eager_T160_B1_packed4_float64", "none_eager_T160_B1_packed4_float64"):
        samples = list(suite.run(ctx, cases[name]))  # the packed batch against each sequence alone
        by = {s.metric: s.value for s in samples}
        assert all(suite.metric(s.metric).passes(s.value) for s in samples), (name, samples)
        assert by["fp64_worst_rel_l2"] <= 1e-9, name
        assert by.get("hops_state_fwd", 3) == 3  # the emulation's chain crosses all 3 boundaries
    assert by["fwd_bwd_ms"] > 0 and "hops_state_fwd" not in by  # the no-CP layer: timed, no chain
    samples = list(suite.run(ctx, cases["p2p_emulated4_eager_T160_B2_valid151_float64"]))
    by = {s.metric: s.value for s in samples}
    assert all(suite.metric(s.metric).passes(s.value) for s in samples)
    assert by["fp64_worst_rel_l2"] <= 1e-9 and by["hops_state_fwd"] == 3 and by["padding_output_max_abs"] == 0
    each = [s.value for s in samples if s.metric == "param_grad_rel_l2_by_param"]
    assert len(each) == 9 and by["param_grad_worst_rel_l2"] == max(each)
    # the reference is the candidate's own no-CP layer here, so CP's share is the worst of everything
    assert by["cp_worst_rel_l2"] == max(by["output_rel_l2"], by["input_grad_rel_l2"], *each)
    with pytest.raises(CPError, match="'p2p' needs a job with world size >= 2"):
        list(suite.run(ctx, cases["p2p_eager_T128_B1_float64"]))


@pytest.mark.slow  # runs cp-layer cases
def test_cp_share_is_measured_against_the_candidates_own_layer(one_torch_thread: None) -> None:
    """With a reference of another dtype (or backend), the candidate is also paired with its own
    no-CP layer, so the two layers' rounding drops out of `cp_worst_rel_l2`."""
    from dataclasses import replace

    import torch

    from gdn.layer import GDNLayerConfig
    from workers.harness.cp_compare import LayerCase, compare_emulated, reference_layer_step
    from workers.measure import worst_rel_l2

    cfg = GDNLayerConfig(hidden_size=32, num_qk_heads=2, num_v_heads=4, head_dim=8)
    cpu = torch.device("cpu")
    case = LayerCase(cfg, "p2p_emulated", dtype=torch.float32, ref_dtype=torch.float64, batch=2,
                     seq_len=128, valid_len=101, seed=5)
    cmp = compare_emulated(case, 4, cpu)
    assert cmp.plain is not None and cmp.output[1].dtype == torch.float64
    _, y32, dx32, _ = reference_layer_step(replace(case, ref_dtype=None), cpu)
    assert torch.equal(cmp.plain.output[1], y32) and torch.equal(cmp.plain.input_grad[1], dx32)
    assert cmp.plain.output[0] is cmp.output[0] and set(cmp.plain.param_grads) == set(cmp.param_grads)
    # fp32 against fp32: the shards' summation order alone (A_log's cancelling sum is the worst)
    assert max(worst_rel_l2(cmp.plain).values()) < 1e-4
    assert compare_emulated(replace(case, ref_dtype=None), 4, cpu).plain is None


def test_a_packed_reference_runs_each_sequence_alone(one_torch_thread: None) -> None:
    """The packed cases' reference restarts at every sequence: a layer that ignored the packing
    (the same tokens as one sequence) would be far from it, so the packed cases have teeth."""
    import torch

    from gdn.layer import GDNLayerConfig
    from tests.support.gdn_inputs import rel_l2
    from workers.harness.cp_compare import LayerCase, build_layer, make_inputs, reference_layer_step

    cfg = GDNLayerConfig(hidden_size=32, num_qk_heads=2, num_v_heads=4, head_dim=8)
    cpu = torch.device("cpu")
    case = LayerCase(cfg, "none", seq_len=160, packed=(1, 63, 65, 31), seed=2)
    _, y_ref, _, _ = reference_layer_step(case, cpu)
    x, _, _ = make_inputs(case, cpu)
    layer = build_layer(case, None, "eager", cpu)
    assert rel_l2(layer(x, None, case.cu_seqlens(cpu)), y_ref) <= 1e-12
    assert rel_l2(layer(x), y_ref) > 1e-3
    with pytest.raises(ValueError, match="lengths summing to seq_len=128"):
        LayerCase(cfg, "p2p", seq_len=128, packed=(1, 63, 65, 31))


def _rank_suite(rank: int, world: int, names: list[str]) -> list[tuple[str, str, float, bool]]:
    import torch
    import torch.distributed as dist

    from workers.context import RankContext
    from workers.registry import get_suite

    suite = get_suite("cp-layer")
    ctx = RankContext(rank, world, torch.device("cpu"), "cpu", group=dist.group.WORLD, seed=7)
    out = []
    for case in suite.cases(suite.resolve_params("quick")):
        if case.name in names:
            for s in suite.run(ctx, case):
                out.append((case.name, s.metric, s.value, suite.metric(s.metric).passes(s.value)))
    return out


@pytest.mark.slow
def test_quick_cases_pass_on_two_ranks() -> None:
    """Quick cases on 2 gloo ranks (Ulysses and P2P over a backend from elsewhere, found by its
    entry point: tests/e2e/test_external_backend.py)."""
    names = ["p2p_eager_T160_B2_valid151_float64", "ulysses_eager_T128_B1_float64",
             "p2p_eager_T160_B1_packed4_float64"]
    per_rank = run_distributed(_rank_suite, 2, (names,), timeout_s=180)
    for rank, samples in enumerate(per_rank):
        failed = [s for s in samples if not s[3]]
        assert not failed, f"rank {rank}: {failed}"
        by = {(c, m): v for c, m, v, _ in samples}
        assert by[(names[0], "fp64_worst_rel_l2")] <= 1e-9
        assert by[(names[0], "hop_counts_ok")] == 1.0
        assert by[(names[0], "hops_state_fwd")] == 1 and by[(names[0], "hops_halo")] == 2
        assert by[(names[1], "hops_state_fwd")] == 0
        # a packed batch, one sequence across the rank boundary: exact, the chain as unpacked
        assert by[(names[2], "fp64_worst_rel_l2")] <= 1e-9 and by[(names[2], "hop_counts_ok")] == 1.0
        assert by[(names[2], "hops_state_fwd")] == 1 and by[(names[2], "hops_halo")] == 2
        assert by[(names[0], "padding_output_max_abs")] == 0.0
        assert sum(1 for c, m, _, _ in samples if c == names[0] and m == "fwd_bwd_ms") == 5  # quick repeat
