"""RayExecutor on a local Ray cluster with fake GPU/NPU resources: placement, jobs, faults, commits.

One cluster for the module. After every job the executor must have released its actors and its
placement group; that is checked through Ray's state API, not through the executor's own word.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.suites_for_tests import RecordingSink, make_marker_repo
from workers.executor import JobSpec
from workers.registry import SUITE_MODULES

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
DEADLINE_S = 25.0  # the hang test's deadline: actors + rank start-up must reach the faulty case first


@pytest.fixture(scope="module")
def executor():
    from workers.executors.ray_executor import RayExecutor

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, num_gpus=2, resources={"NPU": 2}, log_to_driver=False, include_dashboard=True)
    SUITE_MODULES["probe"] = "tests.suites_for_tests"
    ex = RayExecutor(schedule_timeout_s=30)
    yield ex
    SUITE_MODULES.pop("probe", None)
    ray.shutdown()


def _leftovers(timeout: float = 10.0) -> tuple[list, list]:
    """Actors not DEAD and placement groups not REMOVED, after giving the GCS a moment."""
    from ray.util.state import list_actors, list_placement_groups

    end = time.monotonic() + timeout
    while True:
        actors = [a for a in list_actors() if a.state != "DEAD"]
        groups = [g for g in list_placement_groups() if g.state != "REMOVED"]
        if (not actors and not groups) or time.monotonic() > end:
            return actors, groups
        time.sleep(0.5)


def _run(executor, **kw):
    sink = RecordingSink()
    spec = JobSpec(job_id=1, suite=kw.pop("suite", "probe"), deadline_s=kw.pop("deadline_s", 120.0), **kw)
    t0 = time.monotonic()
    outcome = executor.run(spec, sink, threading.Event())
    return outcome, sink, time.monotonic() - t0


def test_max_world_size_follows_cluster_resources(executor) -> None:
    assert executor.max_world_size("cpu") == 4
    assert executor.max_world_size("cuda") == 2
    assert executor.max_world_size("npu") == 2
    outcome, _, elapsed = _run(executor, device="cuda", world_size=3)
    assert outcome.status == "failed" and "world_size 3 exceeds the 2 cuda rank(s)" in outcome.error
    assert elapsed < 5


@pytest.mark.parametrize(
    ("device", "variable"), [("cuda", "CUDA_VISIBLE_DEVICES"), ("npu", "ASCEND_RT_VISIBLE_DEVICES")]
)
def test_fake_accelerators_place_one_actor_per_bundle(executor, device: str, variable: str) -> None:
    ranks = executor.placement(device, 2)
    assert [r["bundle"] for r in ranks] == [0, 1]
    assert len({r["pid"] for r in ranks}) == 2
    assert sorted(r["env"][variable] for r in ranks) == ["0", "1"]  # what Ray set in the actor
    assert [r["assigned"] for r in ranks] == [{variable: r["env"][variable]} for r in ranks]
    assert _leftovers() == ([], [])


def test_capability_runs_on_a_ray_rank(executor) -> None:
    # the fresh-interpreter checks are covered through `gdnval run` in test_capability.py
    outcome, sink, _ = _run(executor, suite="capability", params={"process_checks": False})
    assert outcome.status == "succeeded", outcome.error
    assert sink.cases and all(s in ("passed", "expected_error") for s, _ in sink.cases.values()), sink.cases
    assert sink.cases["failfast_backend_auto"][0] == "expected_error"
    assert sink.values("triton_available_T65536_hqk16", "triton_available_recorded").keys() == {0}
    assert sink.infos[0]["commit"]
    assert _leftovers() == ([], [])


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("raise", "RuntimeError: probe fault on rank 1"),
        ("kill", "rank 1 killed by SIGKILL during case 'fault'"),
        ("kill_parent", "rank 1 actor died"),
        ("hang", f"job deadline of {DEADLINE_S:g} s exceeded: rank 1 in case 'fault'"),
    ],
)
def test_a_faulty_rank_fails_the_job_and_releases_everything(executor, fault: str, reason: str) -> None:
    deadline = DEADLINE_S if fault == "hang" else 60.0
    params = {"fault": fault, "repeats": 1}
    outcome, sink, elapsed = _run(executor, params=params, world_size=2, deadline_s=deadline)
    assert outcome.status == "failed"
    assert outcome.error.startswith("rank 1") and reason in outcome.error, outcome.error
    assert elapsed < deadline + 10
    if fault != "kill_parent":  # a dead actor takes the messages it had not handed over yet
        assert sink.cases["collective"][0] == "passed"
    assert _leftovers() == ([], [])


def test_cancel_kills_the_actors(executor) -> None:
    sink = RecordingSink(cancel_after_case="expects_value_error")  # the next case hangs
    spec = JobSpec(job_id=2, suite="probe", params={"fault": "hang"}, world_size=2, deadline_s=120)
    outcome = executor.run(spec, sink, sink.cancel)
    assert outcome.status == "cancelled"
    assert _leftovers() == ([], [])


def test_two_rank_gloo_job_after_the_faults(executor) -> None:
    outcome, sink, _ = _run(executor, world_size=2, params={"repeats": 2})
    assert outcome.status == "succeeded", outcome.error
    assert sink.values("collective", "allreduce_sum") == {0: [3.0, 3.0], 1: [3.0, 3.0]}
    assert {c: s for c, (s, _) in sink.cases.items()} == {
        "collective": "passed", "bounded": "passed", "expects_value_error": "expected_error",
        "fault": "passed", "after_fault": "passed",
    }  # fmt: skip
    assert len({r["pid"] for r in sink.infos[0]["ranks"]}) == 2
    assert _leftovers() == ([], [])


def test_a_job_runs_its_commit_shipped_through_the_object_store(executor, tmp_path: Path) -> None:
    from workers.executors.ray_executor import RayExecutor

    repo, shas = make_marker_repo(tmp_path)
    ex = RayExecutor(repo=repo, cache_dir=tmp_path / "cache")
    outcome, sink, _ = _run(ex, commit=shas[1], params={"repeats": 1})
    assert outcome.status == "succeeded", outcome.error
    assert sink.values("collective", "marker") == {0: [2.0]}
    assert sink.infos[0]["commit"] == shas[1]
    assert sink.infos[0]["source_root"] == str(tmp_path / "cache" / shas[1])
