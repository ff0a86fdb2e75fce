"""benchmarks/stage_repro_probe.py under the interpreter: two runs of the packed path record the
same stage calls with the same bits, and a difference in one stage's output is named at that
stage."""

from __future__ import annotations

import pytest
import torch

from benchmarks import stage_repro_probe as probe
from gdn.ops import triton_interpreter_on

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not triton_interpreter_on(),
    reason="interpreter tests run on machines without a GPU (TRITON_INTERPRET=1)",
)


def test_two_runs_of_the_packed_path_repeat_stage_by_stage() -> None:
    lengths = [1, 63, 65]
    x = probe.make_inputs(sum(lengths), 1, 0, torch.device("cpu"), lengths, hv=2, dtype="float16")
    first, second = probe.run_once(x), probe.run_once(x)
    names = [name for name, _ in first]
    assert names[:-1] == ["gate_cumsum", "intra_solve", "state_forward", "output", "state_backward",
                          "bwd_dqk", "bwd_wy"]
    assert probe.compare(first, second) == []

    name, outs = second[-2]  # bwd_wy: dk, dv, dbeta, dg
    changed = outs[2].clone()
    changed.view(-1)[0] += 1.0
    second[-2] = (name, [outs[0], outs[1], changed, outs[3]])
    (line,) = probe.compare(first, second)
    assert line.startswith("call 6 bwd_wy: outputs #2 (max 1.0")
