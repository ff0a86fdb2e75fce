"""`workers.measure.time_repeats`: back-to-back repetitions, warm-up excluded, nothing read
before the last repetition is issued, the per-repetition hook outside the timed region; and
the gdn-op suite's timed calls on a CPU rank."""

from __future__ import annotations

import time

import torch

from workers.context import RankContext
from workers.measure import time_repeats

CPU = RankContext(rank=0, world_size=1, device=torch.device("cpu"), device_kind="cpu")


class RecordingTimer:
    """A repetition timer that writes what happens to it into a shared log; the n-th timer made
    reads back n milliseconds."""

    made = 0

    def __init__(self, log: list[tuple[str, int]]) -> None:
        RecordingTimer.made += 1
        self.n, self.log = RecordingTimer.made, log

    def start(self) -> None:
        self.log.append(("start", self.n))

    def stop(self) -> None:
        self.log.append(("stop", self.n))

    def elapsed_ms(self) -> float:
        self.log.append(("read", self.n))
        return float(self.n)


def test_repetitions_are_issued_back_to_back_and_read_after_the_last() -> None:
    log: list[tuple[str, int]] = []
    RecordingTimer.made = 0
    times = time_repeats(
        CPU, lambda: log.append(("call", 0)), warmup=3, repeat=4,
        before=lambda: log.append(("reset", 0)), timer=lambda: RecordingTimer(log),
    )
    assert times == [1.0, 2.0, 3.0, 4.0]  # one sample per repetition, in order
    kinds = [k for k, _ in log]
    # warm-up: three untimed calls, each after its reset
    assert kinds[:6] == ["reset", "call"] * 3
    # then per repetition: reset outside the bracket, the call inside it, and no read
    assert kinds[6:22] == ["reset", "start", "call", "stop"] * 4
    # every read comes after the last repetition was issued
    assert kinds[22:] == ["read"] * 4 and len(kinds) == 26


def test_warm_up_calls_are_not_timed() -> None:
    calls = []

    def fn() -> None:
        calls.append(1)
        time.sleep(0.2 if len(calls) <= 2 else 0.001)  # the first two calls: a slow compile

    times = time_repeats(CPU, fn, warmup=2, repeat=5)
    assert len(calls) == 7 and len(times) == 5
    assert max(times) < 150.0  # a slow warm-up call would read >= 200 ms
    assert min(times) >= 1.0


def test_gdn_op_timed_calls_drop_gradients_outside_the_call(one_torch_thread: None) -> None:
    """The suite's fwd+bwd: the leaves get fresh gradients every call (no accumulation), and
    `reset` drops them."""
    from workers.registry import get_suite
    from workers.suites.gdn_op.run import _leaves, _make_inputs, timed_calls

    suite = get_suite("gdn-op")
    case = next(c for c in suite.cases(suite.resolve_params("quick")) if c.params["mode"] == "stateful")
    x = _leaves(_make_inputs(CPU, dict(case.params), 0))
    fwd, fwd_bwd, reset = timed_calls("eager", x, final=True)
    fwd_bwd()
    first = {n: x[n].grad.clone() for n in ("q", "k", "v", "g", "beta", "h0")}
    reset()
    assert all(x[n].grad is None for n in first)
    fwd_bwd()
    assert all(torch.equal(x[n].grad, first[n]) for n in first)  # fresh, not doubled
    fwd()
    assert all(torch.equal(x[n].grad, first[n]) for n in first)  # a forward leaves them alone


def test_gdn_op_case_on_cpu_yields_one_sample_per_repetition(one_torch_thread: None) -> None:
    from workers.registry import get_suite

    suite = get_suite("gdn-op")
    params = suite.resolve_params("quick", {"backends": ["eager"], "eager_repeat": 3, "eager_warmup": 1})
    case = suite.cases(params)[0]
    samples = list(suite.run(CPU, case))
    by_metric: dict[str, list[int]] = {}
    for s in samples:
        by_metric.setdefault(s.metric, []).append(s.idx)
    for metric in ("fwd_ms", "fwd_bwd_ms", "fwd_rel", "fwd_bwd_rel"):
        assert sorted(by_metric[metric]) == [0, 1, 2], metric
    assert "peak_bytes" not in by_metric  # a CPU's memory is not tracked: no sample, not 0
