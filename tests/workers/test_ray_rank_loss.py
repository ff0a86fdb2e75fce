"""Ranks lost on a real Ray cluster (`ray.cluster_utils.Cluster`, a head and two 2-CPU nodes,
Ray's default node health checks), with the Ray executor:

- a rank stopped with SIGSTOP ends its job at the stall limit, naming the rank and where it ran;
- a node killed while its rank hangs and the other rank waits for it at the end of a case: the
  other rank soon reports it lost its peer, but the job's failure names the lost rank, its node
  id and its host.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.support.suites import RecordingSink, probe_registered
from workers.executors.base import JobSpec

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
STALL_S = 5.0


@pytest.fixture(scope="module")
def cluster():  # type: ignore[no-untyped-def]
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [c.add_node(num_cpus=2, resources={"cpu_node": 1}) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    with probe_registered():
        yield c, nodes
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def executor(cluster):  # type: ignore[no-untyped-def]
    from workers.executors.ray_executor import RayExecutor

    return RayExecutor(address=cluster[0].address, schedule_timeout_s=60)


def _start(executor, spec: JobSpec) -> tuple[RecordingSink, dict, threading.Thread]:  # type: ignore[no-untyped-def]
    sink, result = RecordingSink(), {}
    cancel = threading.Event()
    thread = threading.Thread(target=lambda: result.update(outcome=executor.run(spec, sink, cancel)))
    thread.start()
    return sink, result, thread


def _ranks_once(sink: RecordingSink, until_case: str, thread: threading.Thread, result: dict) -> list[dict]:
    end = time.monotonic() + 120
    while not any("ranks" in i for i in sink.infos) or until_case not in sink.cases:
        assert time.monotonic() < end and thread.is_alive(), (sink.logs[-5:], result)
        time.sleep(0.2)
    return next(i["ranks"] for i in sink.infos if "ranks" in i)


def test_a_stopped_ray_rank_ends_its_job_at_the_stall_limit(executor) -> None:  # type: ignore[no-untyped-def]
    spec = JobSpec(job_id=1, suite="probe", params={"repeats": 1, "pause_s": 120}, world_size=2,
                   placement="SPREAD", deadline_s=600, stall_s=STALL_S)
    sink, result, thread = _start(executor, spec)
    ranks = _ranks_once(sink, "collective", thread, result)
    victim = ranks[1]
    os.kill(victim["pid"], signal.SIGSTOP)  # the ranks of this local cluster are processes here
    stopped = time.monotonic()
    thread.join(60)
    outcome = result["outcome"]
    assert outcome.status == "failed"
    where = f"rank 1 on node {victim['node_id']} (host {victim['node_host']}, {victim['node_ip']})"
    assert outcome.error.startswith(f"{where} made no progress for "), outcome.error
    assert "its process is stopped or frozen during case 'bounded'" in outcome.error
    assert time.monotonic() - stopped < STALL_S + 15


def test_a_lost_node_is_named_not_the_peer_that_saw_it_go(executor, cluster) -> None:  # type: ignore[no-untyped-def]
    c, nodes = cluster
    spec = JobSpec(job_id=2, suite="probe", params={"repeats": 1, "fault": "hang", "fault_rank": 1},
                   world_size=2, placement="STRICT_SPREAD", deadline_s=600)
    sink, result, thread = _start(executor, spec)
    ranks = _ranks_once(sink, "expects_value_error", thread, result)
    time.sleep(2.0)  # rank 0 has finished case 'fault' and waits for rank 1 at its end
    victim = ranks[1]
    node = next(n for n in nodes if n.node_id == victim["node_id"])
    killed = time.monotonic()
    c.remove_node(node, allow_graceful=False)
    thread.join(120)
    outcome = result["outcome"]
    assert outcome.status == "failed"
    where = f"rank 1 on node {victim['node_id']} (host {victim['node_host']}, {victim['node_ip']})"
    assert outcome.error.startswith(where), outcome.error
    assert time.monotonic() - killed < 60
