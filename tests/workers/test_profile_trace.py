"""What the profile suite reads from a trace (`workers.suites.profile.trace`): planted Chrome traces
of a device (kernels on two streams) and of a host (gloo's worker threads beside the main thread),
whose communication, compute and overlap are known to the microsecond."""

from __future__ import annotations

from typing import Any

import pytest

from workers.suites.profile.trace import family, intersection, summarise_trace, union


def ev(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def test_device_kernels_overlap_across_streams() -> None:
    events = [
        ev("ncclDevKernel_AllGather_RING_LL", 0, 100, tid=7, cat="kernel"),
        ev("ncclDevKernel_SendRecv", 150, 50, tid=7, cat="kernel"),
        ev("chunk_fwd_kernel", 50, 100, tid=8, cat="kernel"),  # under half the gather
        ev("aten::mm", 0, 1000, cat="cpu_op"),  # host operators do not count beside device kernels
        {"ph": "M", "name": "process_name"},
    ]
    s = summarise_trace(events)
    assert s.source == "device"
    assert (s.comm_ms, s.compute_ms, s.overlap_ms) == pytest.approx((0.15, 0.1, 0.05))
    assert s.overlap_share == pytest.approx(1 / 3)
    assert s.family_ms == pytest.approx({"all_gather": 0.1, "send_recv": 0.05})
    assert s.family_calls == {"all_gather": 1, "send_recv": 1}


def test_host_collectives_on_gloo_threads_and_the_callers_blocking_ones() -> None:
    events = [
        ev("gloo:all_gather", 100, 200, tid=2),  # FSDP's gather on gloo's thread
        ev("aten::linear", 0, 250, tid=1),  # the main thread computes under the first 150 us of it
        ev("aten::mm", 10, 100, tid=1),  # nested: counted once
        ev("c10d::send", 400, 60, tid=1),
        ev("gloo:send", 405, 50, tid=1),  # the caller blocks in it
        ev("aten::copy_", 410, 10, tid=1),  # inside the send: communication, not compute
    ]
    s = summarise_trace(events)
    assert s.source == "host"
    assert s.comm_ms == pytest.approx(0.25) and s.compute_ms == pytest.approx(0.25)
    assert s.overlap_ms == pytest.approx(0.15) and s.family_calls == {"all_gather": 1, "send_recv": 1}


def test_operators_when_no_collective_work_is_traced_and_nothing_without_any() -> None:
    s = summarise_trace([ev("c10d::alltoall_base_", 0, 30), ev("aten::add", 40, 10)])
    assert (s.source, s.family_calls, s.overlap_share) == ("operators", {"all_to_all": 1}, 0.0)
    quiet = summarise_trace([ev("aten::add", 0, 10)])
    assert (quiet.source, quiet.comm_ms, quiet.overlap_share) == ("none", 0.0, None)


def test_interval_arithmetic_and_families() -> None:
    assert union([(5, 7), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 7)]
    assert intersection([(0, 4), (5, 7)], [(3, 6)]) == 2
    assert [
        family(n)
        for n in (
            "gloo:all_to_all",
            "c10d::alltoall_base_",
            "ncclKernel_ReduceScatter",
            "hcclAllReduce",
            "c10d::broadcast_",
            "c10d::barrier",
        )
    ] == ["all_to_all", "all_to_all", "reduce_scatter", "all_reduce", "broadcast", "other"]
