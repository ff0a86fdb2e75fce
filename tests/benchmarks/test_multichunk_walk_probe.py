"""benchmarks/multichunk_walk_probe.py: the composed multi-chunk maps walk to the same states as
the per-chunk maps, so the probe's errors measure rounding and nothing else."""

from __future__ import annotations

import pytest
import torch

from benchmarks import multichunk_walk_probe as probe


@pytest.mark.parametrize("gate_bias", [2.0, 8.0])
def test_composed_maps_walk_to_the_per_chunk_states(gate_bias: float) -> None:
    A, B = probe.chunk_maps(T=640, heads=1, D=16, seed=1, gate_bias=gate_bias)
    assert A.shape == B.shape == (1, 10, 16, 16)
    for group in (1, 3, 10):  # a short last group (10 = 3 + 3 + 3 + 1) and one group of all
        worst, final = probe.walk_errors(A, B, group, "fp32")
        assert worst < 1e-5 and final <= worst


def test_rounded_operands_keep_their_mantissa_bits() -> None:
    x = torch.tensor([1.0 + 2.0**-10 + 2.0**-12, 3.0 + 2.0**-20], dtype=torch.float64)
    tf32 = probe.rounded(x, "tf32")
    assert tf32.tolist() == [1.0 + 2.0**-10, 3.0]  # 10 mantissa bits, the 2^-12 and 2^-20 gone
    assert probe.rounded(x, "bf16").tolist() == [1.0, 3.0]
    assert probe.rounded(x, "fp32").tolist() == x.float().double().tolist()


def test_the_command_refuses_a_length_that_is_not_whole_chunks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        probe.main(["--seq-len", "100"])
    assert "expected a positive multiple of 64" in capsys.readouterr().err
