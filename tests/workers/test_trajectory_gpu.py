"""The report's GPU acceptance (docs/benchmarks.md, Network) on one CUDA device; skipped without one.

The 4-layer hidden-2048 network trains 200 steps from the token stream with the Triton backend
against the eager reference, bf16 (autocast over fp32 master weights on both sides): loss max rel
< 4e-4 and grad-norm max rel < 4e-3 (the report's figures), no NaN/Inf.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gdn.data import build_corpus_token_file

    path = tmp_path_factory.mktemp("gpu-tokens") / "package.bin"
    build_corpus_token_file(path, "package")
    return path


def test_4_layer_bf16_triton_matches_eager_over_200_steps(token_file: Path) -> None:
    from workers.harness.trajectory import TrajectoryConfig, run_trajectory

    cfg = TrajectoryConfig(
        model="qwen35-4l", steps=200, lr=1e-4, seq_len=8192, batch_size=1, dtype="bfloat16",
        reference_backend="eager", backend="triton", cp_mode="none",
    )
    cmp = run_trajectory(cfg, token_file, torch.device("cuda"))  # NaN/Inf raises NonFiniteTrajectory
    print(
        f"loss max rel {cmp.max_rel('loss'):.3e} abs {cmp.max_abs('loss'):.3e}; "
        f"grad-norm max rel {cmp.max_rel('grad_norm'):.3e} abs {cmp.max_abs('grad_norm'):.3e}"
    )
    assert cmp.max_rel("loss") < 4e-4
    assert cmp.max_rel("grad_norm") < 4e-3
    assert cmp.reference[-1].loss < cmp.reference[0].loss


def test_checkpoint_full_is_bit_identical_under_deterministic_mode(token_file: Path) -> None:
    from gdn.device import set_deterministic
    from workers.harness.trajectory import TrajectoryConfig, run_determinism_pair

    cfg = TrajectoryConfig(
        model="qwen35-4l", steps=10, lr=1e-4, seq_len=8192, dtype="bfloat16", backend="triton", cp_mode="none"
    )
    set_deterministic("cuda", True)
    try:
        res = run_determinism_pair(cfg, token_file, torch.device("cuda"))
    finally:
        set_deterministic("cuda", False)
    assert res.losses_identical and res.grad_norms_identical and res.params_identical, res.max_param_diff
