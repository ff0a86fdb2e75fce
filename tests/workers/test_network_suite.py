"""Metadata of the `network`, `stability` and `profile` suites: torch-free, presets, cases, bounds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workers.registry import get_suite
from workers.suite import UnknownSuiteInput

SUITES = ("network", "stability", "profile")


def test_metadata_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from workers.registry import get_suite\n"
        f"for n in {SUITES!r}:\n"
        "    s = get_suite(n); [s.cases(s.resolve_params(p)) for p in s.presets]; s.describe()\n"
        "assert 'torch' not in sys.modules, 'suite metadata imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_network_quick_matrix() -> None:
    suite = get_suite("network")
    names = [c.name for c in suite.cases(suite.resolve_params("quick"))]
    for mode in ("ulysses", "p2p", "all_gather"):
        for ckpt in ("off", "full"):
            assert f"traj/{mode}/ckpt-{ckpt}" in names and f"speed/{mode}/ckpt-{ckpt}" in names
    assert "determinism/p2p" in names
    case = next(c for c in suite.cases(suite.resolve_params("quick")) if c.name == "traj/p2p/ckpt-full")
    assert case.params["steps"] == 20 and case.params["dtype"] == "float32" and case.params["fsdp"] is True
    assert case.params["lr"] > 0


def test_network_gpu_presets_are_the_report_run() -> None:
    suite = get_suite("network")
    full = suite.resolve_params("full")
    assert (full.model, full.steps, full.dtype, full.backend) == ("qwen35-4l", 200, "bfloat16", "triton")
    assert suite.resolve_params("gate").model == "qwen35-4l"
    # the 8-layer network and CP modes are parameter overrides of the same preset
    over = suite.resolve_params("full", {"model": "qwen35-8l", "modes": ["ulysses", "p2p"]})
    assert [c.name for c in suite.cases(over)][:2] == ["traj/ulysses/ckpt-off", "speed/ulysses/ckpt-off"]


def test_trajectory_bounds_by_precision() -> None:
    suite = get_suite("network")
    assert suite.metric("fp32_loss_max_rel").bound == 1e-5
    assert suite.metric("fp32_grad_norm_max_rel").bound == 1e-4
    assert suite.metric("bf16_loss_max_rel").bound == 4e-4
    assert suite.metric("bf16_grad_norm_max_rel").bound == 4e-3
    assert suite.metric("fp32_loss_rel_err").kind == "trajectory"
    assert not suite.metric("fp32_loss_max_rel").passes(2e-5)
    det = suite.metric("det_max_param_diff")
    assert det.passes(0.0) and not det.passes(1e-12)
    assert get_suite("stability").metric("memory_growth_bytes").bound == 1 << 20


@pytest.mark.parametrize(
    ("suite", "params", "message"),
    [
        ("network", {"modes": ["ring"]}, r"unknown CP mode\(s\) \['ring'\]"),
        ("network", {"checkpoints": ["some"]}, r"unknown activation checkpoint mode\(s\) \['some'\]"),
        ("network", {"reference_checkpoint": "half"}, r"unknown activation checkpoint mode\(s\) \['half'\]"),
        ("network", {"backend": "triton", "candidate_chunk_size": 32},
         r"candidate_chunk_size=32 needs backend 'eager'"),
        ("network", {"candidate_chunk_size": 0}, r"candidate_chunk_size must be >= 1"),
        ("network", {"dtype": "float16"}, r"dtype 'float16' is not supported"),
        ("stability", {"modes": ["none"]}, r"unknown distributed CP mode\(s\) \['none'\]"),
        ("stability", {"passes": 1}, r"passes must be >= 2"),
        ("profile", {"modes": ["x"]}, r"unknown CP mode\(s\) \['x'\]"),
    ],
)
def test_bad_parameters(suite: str, params: dict, message: str) -> None:  # type: ignore[type-arg]
    s = get_suite(suite)
    with pytest.raises(ValueError, match=message):
        s.cases(s.resolve_params("quick", params))


def test_unknown_parameter_is_rejected() -> None:
    with pytest.raises(UnknownSuiteInput, match=r"unknown parameter\(s\) \['layers'\]"):
        get_suite("network").resolve_params("quick", {"layers": 3})
