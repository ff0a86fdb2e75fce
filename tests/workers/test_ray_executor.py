"""RayExecutor on a real multi-node Ray cluster (`ray.cluster_utils.Cluster`, fake GPU/NPU).

One cluster for the module: a head with no resources, two 2-CPU worker nodes marked for CPU
ranks (`cpu_node`), and one accelerator node with 2 CPUs, fake `GPU: 2` and `NPU: 2`. After
every job the executor must have released its actors and its placement group; that is checked
through Ray's state API, not through the executor's own word. The node-kill test runs last: it
takes a CPU node away for good.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from tests.support.ports import free_port
from tests.support.suites import RecordingSink, make_marker_repo, probe_registered
from workers.executors.base import JobSpec

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


DEADLINE_S = 45.0  # the hang test's deadline: actors + rank start-up must reach the faulty case first,
# which took over 20 s on a loaded 2-core machine
HEALTH = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 1000,
          "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}
HEARTBEAT_TIMEOUT_S = 3.0  # period x failure threshold: when the GCS declares a silent node dead


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": True, "dashboard_port": free_port(), "_system_config": HEALTH,
    })
    nodes = {
        "cpu_a": c.add_node(num_cpus=2, resources={"cpu_node": 1}),
        "cpu_b": c.add_node(num_cpus=2, resources={"cpu_node": 1}),
        "accel": c.add_node(num_cpus=2, num_gpus=2, resources={"NPU": 2}),
    }
    ray.init(address=c.address, log_to_driver=False)
    with probe_registered():
        yield c, nodes
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def executor(cluster):
    from workers.executors.ray_executor import RayExecutor

    return RayExecutor(address=cluster[0].address, schedule_timeout_s=30)


def _node_ids(cluster) -> dict[str, str]:
    return {name: node.node_id for name, node in cluster[1].items()}


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


def _run(executor, sink: RecordingSink | None = None, **kw):
    sink = sink or RecordingSink()
    spec = JobSpec(job_id=1, suite=kw.pop("suite", "probe"), deadline_s=kw.pop("deadline_s", 120.0), **kw)
    t0 = time.monotonic()
    outcome = executor.run(spec, sink, threading.Event())
    return outcome, sink, time.monotonic() - t0


def _ranks(sink: RecordingSink) -> list[dict]:
    return next(i["ranks"] for i in sink.infos if "ranks" in i)


def test_capacity_is_counted_per_node_kind_and_strategy(executor) -> None:
    assert executor.most_ranks("cpu") == 4  # PACK: both CPU nodes; the accelerator node takes none
    assert executor.most_ranks("cpu", "STRICT_PACK") == 2
    assert executor.most_ranks("cpu", "STRICT_SPREAD") == 2
    assert executor.most_ranks("cuda") == executor.most_ranks("npu") == 2
    assert executor.free_ranks("cpu") == 4 and executor.free_ranks("cuda", "STRICT_PACK") == 2
    outcome, _, elapsed = _run(executor, device="cuda", world_size=3)
    assert outcome.status == "failed" and "world_size 3 exceeds the 2 cuda rank(s)" in outcome.error
    assert elapsed < 5


def test_submit_checks_the_job_placement_against_the_cluster(executor, cluster) -> None:
    """The service's settings choose the executor's strategy; a job's label `placement` overrides
    it, and what can never fit under that strategy is refused at submit."""
    from pydantic import ValidationError

    from service.domain.submission import InvalidJob, validate_request
    from service.executor_choice import build_executor
    from service.settings import Settings

    built = build_executor(Settings(executor="ray", ray_address=cluster[0].address, placement="SPREAD"))
    assert (built.placement_strategy, built.cpu_node_resource) == ("SPREAD", "cpu_node")
    with pytest.raises(ValidationError, match="unknown placement strategy 'RANDOM'"):
        Settings(placement="RANDOM")
    def job(world_size: int, placement: str | None = None) -> dict:
        labels = {"placement": placement} if placement else {}
        return {"suite": "probe", "world_size": world_size, "labels": labels}

    assert validate_request(job(4), executor).world_size == 4  # PACK spans both CPU nodes
    assert validate_request(job(2, "STRICT_SPREAD"), executor).labels == {"placement": "STRICT_SPREAD"}
    with pytest.raises(InvalidJob, match=r"with placement STRICT_PACK can never be satisfied: .* most 2 cpu"):
        validate_request(job(4, "STRICT_PACK"), executor)
    with pytest.raises(InvalidJob, match="label 'placement': unknown placement strategy 'pack'"):
        validate_request(job(1, "pack"), executor)


@pytest.mark.parametrize(
    ("device", "variable"), [("cuda", "CUDA_VISIBLE_DEVICES"), ("npu", "ASCEND_RT_VISIBLE_DEVICES")]
)
def test_fake_accelerators_place_one_actor_per_bundle(executor, cluster, device: str, variable: str) -> None:
    ranks = executor.placement(device, 2)
    assert [r["bundle"] for r in ranks] == [0, 1]
    assert {r["node_id"] for r in ranks} == {_node_ids(cluster)["accel"]}
    assert len({r["pid"] for r in ranks}) == 2
    assert sorted(r["env"][variable] for r in ranks) == ["0", "1"]  # what Ray set in the actor
    assert [r["assigned"] for r in ranks] == [{variable: r["env"][variable]} for r in ranks]
    assert _leftovers() == ([], [])


def test_spread_cp_layer_job_runs_on_two_nodes(executor, cluster, one_torch_thread) -> None:
    params = {"candidates": ["p2p+eager"], "seq_lens": [256], "padding_cases": [], "packed_cases": [],
              "dtypes": ["float32"], "warmup": 0, "repeat": 1}
    outcome, sink, _ = _run(executor, suite="cp-layer", params=params, world_size=4, placement="SPREAD")
    assert outcome.status == "succeeded", outcome.error
    assert sink.cases and all(s == "passed" for s, _ in sink.cases.values()), sink.cases
    ranks = _ranks(sink)
    ids = _node_ids(cluster)
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    assert {r["node_id"] for r in ranks} == {ids["cpu_a"], ids["cpu_b"]}  # never the accelerator node
    assert all(r["node_ip"] and r["pid"] and r["actor_pid"] and r["device_name"] for r in ranks), ranks
    assert next(i for i in sink.infos if "placement" in i)["placement"] == "SPREAD"
    assert _leftovers() == ([], [])


def test_capability_runs_on_a_ray_rank(executor) -> None:
    # the fresh-interpreter checks are covered through `gdnval run` in test_capability.py
    outcome, sink, _ = _run(executor, suite="capability", params={"process_checks": False})
    assert outcome.status == "succeeded", outcome.error
    assert sink.cases and all(s in ("passed", "expected_error") for s, _ in sink.cases.values()), sink.cases
    assert sink.cases["failfast_backend_auto"][0] == "expected_error"
    assert sink.values("triton_available_T65536_hqk16", "triton_available_recorded").keys() == {0}
    assert next(i for i in sink.infos if "ranks" in i)["commit"]
    assert _leftovers() == ([], [])


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("kill", "rank 1 killed by SIGKILL during case 'fault'"),
        ("kill_parent", "actor died"),
        ("hang", f"job deadline of {DEADLINE_S:g} s exceeded: rank 1 in case 'fault'"),
    ],
)
def test_a_faulty_rank_fails_the_job_and_releases_everything(
    executor, cluster, fault: str, reason: str
) -> None:
    deadline = DEADLINE_S if fault == "hang" else 60.0
    params = {"fault": fault, "repeats": 1}
    outcome, sink, elapsed = _run(executor, params=params, world_size=2, deadline_s=deadline)
    assert outcome.status == "failed"
    assert outcome.error.startswith("rank 1") and reason in outcome.error, outcome.error
    if fault == "kill_parent":  # the actor is gone: the error says on which node it ran
        where = re.match(r"rank 1 on node ([0-9a-f]+) \(", outcome.error)
        ids = _node_ids(cluster)
        assert where and where.group(1) in (ids["cpu_a"], ids["cpu_b"]), outcome.error
    assert elapsed < deadline + 10
    if fault != "kill_parent":  # a dead actor takes the messages it had not handed over yet
        assert sink.cases["collective"][0] == "passed"
    assert _leftovers() == ([], [])


def test_ray_names_the_jobs_actors_and_cancel_kills_them(executor) -> None:
    """While a job runs, Ray's state API (what `ray list actors` / `ray list placement-groups`
    print) names its placement group and rank actors after it, with its id in their runtime_env;
    a cancel removes them all."""
    from ray.util.state import list_actors, list_placement_groups

    sink, cancel, result = RecordingSink(), threading.Event(), {}
    spec = JobSpec(job_id=2, suite="probe", params={"fault": "hang"}, world_size=2, deadline_s=120)
    thread = threading.Thread(target=lambda: result.update(outcome=executor.run(spec, sink, cancel)))
    thread.start()
    end = time.monotonic() + 60
    while "expects_value_error" not in sink.cases:  # the next case hangs: the ranks stay up
        assert time.monotonic() < end and thread.is_alive(), (sink.infos, result)
        time.sleep(0.2)
    try:
        groups = [g for g in list_placement_groups(detail=True) if g.state == "CREATED"]
        assert [g.name for g in groups] == ["gdnval-job-2"]
        actors = sorted((a for a in list_actors(detail=True) if a.state == "ALIVE"), key=lambda a: a.name)
        assert [(a.name, a.repr_name) for a in actors] == [
            ("gdnval-job-2-rank-0", "gdnval-job-2-rank-0"), ("gdnval-job-2-rank-1", "gdnval-job-2-rank-1"),
        ]
        assert {a.placement_group_id for a in actors} == {groups[0].placement_group_id}
        assert all('"GDNVAL_JOB_ID": "2"' in a.serialized_runtime_env for a in actors), actors[0]
    finally:
        cancel.set()
        thread.join(60)
    assert result["outcome"].status == "cancelled"
    assert _leftovers() == ([], [])


def test_a_job_runs_its_commit_from_the_shipped_runtime_env(executor, cluster, tmp_path: Path) -> None:
    """No node has the commit on disk: the driver stages it, Ray ships it as the actors'
    working_dir (content-addressed), and the ranks import from Ray's unpacked copy."""
    from workers.executors.ray_executor import RayExecutor

    repo, shas = make_marker_repo(tmp_path)
    ex = RayExecutor(address=cluster[0].address, repo=repo)
    outcome, sink, _ = _run(ex, commit=shas[1], params={"repeats": 2}, world_size=2,
                            placement="STRICT_SPREAD")
    assert outcome.status == "succeeded", outcome.error
    assert sink.values("collective", "marker") == {0: [2.0], 1: [2.0]}  # the commit's code, not ours (1.0)
    assert sink.values("collective", "allreduce_sum") == {0: [3.0, 3.0], 1: [3.0, 3.0]}
    shipped = next(i["snapshot"] for i in sink.infos if "snapshot" in i)
    assert shipped["commit"] == shas[1] and re.fullmatch(r"[0-9a-f]{16,}", shipped["content_hash"])
    assert shipped["runtime_env_uri"] == f"gcs://_ray_pkg_{shipped['content_hash']}.zip"
    info = next(i for i in sink.infos if "source_root" in i)
    assert info["commit"] == shas[1]
    root = Path(info["source_root"])  # Ray's per-node unpacked package, keyed by the content hash
    assert root.name == shas[1] and root.parent.name == f"_ray_pkg_{shipped['content_hash']}"
    assert "runtime_resources" in root.parts and not root.is_relative_to(tmp_path)
    assert len({r["node_id"] for r in _ranks(sink)}) == 2
    assert _leftovers() == ([], [])


EXT_PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "ext-ray-gdn"
version = "0.3.0"

[project.entry-points."gdnval.backends"]
extray = "extray:core"
"""
EXT_CORE = '''"""A backend from another repository: our eager core under its own name."""
from gdn.backends.eager import eager_core


def core(q, k, v, g, beta, **kw):
    return eager_core(q, k, v, g, beta, **kw)
'''


def test_a_job_builds_its_backend_source_on_every_ranks_node(cluster, tmp_path: Path) -> None:
    """A backend named by a git repository and commit (on no node's path): the driver only ships
    the commit's tree, each rank's actor builds it on its node into the node cache (ranks that
    share a cache build it once), and the ranks on two nodes find its entry point, record its
    distribution and commit, and run its capability contract. A commit that does not exist fails
    the job before any actor starts, naming the source; one that does not build fails it naming
    the node."""
    import os
    import subprocess

    from workers.executors.ray_executor import RayExecutor

    repo = tmp_path / "ext"
    (repo / "extray").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(EXT_PYPROJECT)
    (repo / "extray" / "__init__.py").write_text(EXT_CORE)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]

    def commit(message: str) -> str:
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", message], check=True)
        head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
        return head.stdout.strip()

    subprocess.run([*git, "init", "-q"], check=True)
    sha = commit("backend")
    (repo / "pyproject.toml").write_text("[build-system\n")
    broken = commit("a pyproject.toml no build can read")

    host, nodes = tmp_path / "host-cache", tmp_path / "node-cache"
    ex = RayExecutor(address=cluster[0].address, backend_cache=host, node_backend_cache=str(nodes))
    params = {"process_checks": False, "backends": ["extray"], "contract_packed": False, "seq_lens": [8192],
              "qk_heads": [16]}
    outcome, sink, _ = _run(ex, suite="capability", params=params, world_size=2, placement="STRICT_SPREAD",
                            backend_source=f"git+{repo}@{sha}")
    assert outcome.status == "succeeded", outcome.error
    assert sink.values("backend_extray_float64_d64", "backend_contract") == {0: [1.0], 1: [1.0]}
    ranks = _ranks(sink)
    assert len({r["node_id"] for r in ranks}) == 2
    shipped = next(i["snapshot"] for i in sink.infos if "snapshot" in i)
    assert shipped["backend_tree"] == f"backend-src-git-{sha}" and "commit" not in shipped  # none of ours
    installs = next(i["backend_install"] for i in sink.infos if "backend_install" in i)
    by_rank = {r["rank"]: r for r in ranks}
    for i in installs:  # built by the rank's own actor, on its node, into the node cache
        assert i["path"] == str(nodes / f"git-{sha}"), i
        assert (i["node_id"], i["pid"]) == (by_rank[i["rank"]]["node_id"], by_rank[i["rank"]]["actor_pid"])
        assert i["pid"] != os.getpid()
    assert sorted(i["built"] for i in installs) == [False, True]  # one cache on this machine: one build
    assert (nodes / f"git-{sha}" / "extray" / "__init__.py").is_file()
    assert (host / "trees" / sha).is_dir() and not (host / f"git-{sha}").exists()  # nothing built here
    provenance = next(i["backends"] for i in sink.infos if "backends" in i)
    content = [b.pop("content_hash") for b in provenance]  # the installed package's bytes
    assert provenance == [{"backend": "extray", "distribution": "ext-ray-gdn", "version": "0.3.0",
                           "commit": sha}]
    assert all(isinstance(c, str) and len(c) == 64 for c in content), content
    assert _leftovers() == ([], [])

    outcome, _, _ = _run(ex, suite="capability", params=params, backend_source=f"git+{repo}@{'0' * 40}")
    assert outcome.status == "failed" and outcome.error.startswith("cannot install the backend source")
    assert f"git+{repo}@{'0' * 40}" in outcome.error

    outcome, _, _ = _run(ex, suite="capability", params=params, backend_source=f"git+{repo}@{broken}")
    assert outcome.status == "failed", outcome.error
    assert re.match(r"cannot install the backend source for rank 0 on node [0-9a-f]+ \(", outcome.error)
    assert "pyproject.toml" in outcome.error, outcome.error
    assert not (nodes / f"git-{broken}").exists()
    assert _leftovers() == ([], [])


def test_dispatcher_claims_only_what_fits_now(executor, cluster, tmp_path: Path) -> None:
    """A CPU job holding every CPU-node CPU: a fake-GPU job submitted meanwhile runs at once on
    the accelerator node (on CPU it then fails with the documented "no cuda device"), a second
    CPU job stays queued (it fits the cluster, not its free CPUs) and runs once the first ends.
    Then a CPU load outside gdnval holds the accelerator node's CPUs: a fake-GPU job stays queued
    (no CPU left for its ranks' bundles) and runs once the load is gone."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from service.dispatcher import Dispatcher
    from service.persistence import db, queue
    from service.persistence.models import JobRow
    from service.settings import Settings

    settings = Settings(db_url=f"sqlite:///{tmp_path / 'q.db'}", poll_interval_s=0.1,
                        device_limits={"cpu": 4, "cuda": 4, "npu": 4},
                        artifacts_dir=tmp_path / "art")
    engine = db.make_engine(settings.db_url)
    db.upgrade(engine)

    def status(job_id: int) -> JobRow:
        with Session(engine) as s:
            return s.get(JobRow, job_id)

    def wait(cond, timeout: float = 90.0) -> None:
        end = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < end, "condition not met in time"
            time.sleep(0.2)

    def submit(**kw) -> int:
        return queue.submit(engine, queue.JobRequest(suite="probe", **kw))[0].id

    d = Dispatcher(settings, engine, executor)
    d.start()
    try:
        holder = submit(world_size=4, params={"fault": "hang", "repeats": 1}, labels={"placement": "SPREAD"})
        wait(lambda: executor.free_ranks("cpu") == 0 and status(holder).status == "running")
        gpu = submit(device="cuda", world_size=2, params={"repeats": 1})
        waiter = submit(world_size=2, params={"repeats": 1})
        wait(lambda: status(gpu).status == "failed")
        assert "no cuda device" in status(gpu).error.lower(), status(gpu).error
        time.sleep(1.0)  # several dispatcher ticks with the CPU pool full
        assert status(waiter).status == "queued" and status(holder).status == "running"
        queue.cancel(engine, holder)
        wait(lambda: status(waiter).status in ("succeeded", "failed"))
        assert status(waiter).status == "succeeded", status(waiter).error
        assert status(holder).status == "cancelled"

        @ray.remote(num_cpus=2)
        class Load:
            def ready(self) -> bool:
                return True

        pin = NodeAffinitySchedulingStrategy(_node_ids(cluster)["accel"], soft=False)
        load = Load.options(scheduling_strategy=pin).remote()
        assert ray.get(load.ready.remote(), timeout=60)
        wait(lambda: executor.free_ranks("cuda") == 0)
        queued_gpu = submit(device="cuda", world_size=1, params={"repeats": 1})
        time.sleep(1.5)  # several dispatcher ticks with the accelerator node's CPUs taken
        assert status(queued_gpu).status == "queued"
        ray.kill(load)
        wait(lambda: status(queued_gpu).status == "failed")
        assert "no cuda device" in status(queued_gpu).error.lower(), status(queued_gpu).error
    finally:
        d.stop()
        engine.dispose()
    assert _leftovers() == ([], [])


def test_a_killed_worker_node_fails_the_job_naming_rank_and_node(executor, cluster) -> None:
    """Last in the module: the node does not come back."""
    c, nodes = cluster
    sink = RecordingSink()
    spec = JobSpec(job_id=3, suite="probe", params={"fault": "hang", "repeats": 1}, world_size=4,
                   placement="SPREAD", deadline_s=120)
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.update(outcome=executor.run(spec, sink, threading.Event()))
    )
    thread.start()
    end = time.monotonic() + 60
    while not any("ranks" in i for i in sink.infos) or "expects_value_error" not in sink.cases:
        assert time.monotonic() < end and thread.is_alive(), (sink.infos, result)
        time.sleep(0.2)
    hung = _ranks(sink)[1]  # rank 1 hangs in case 'fault': its node is the one to lose
    victim = next(name for name, n in nodes.items() if n.node_id == hung["node_id"])
    killed_at = time.monotonic()
    c.remove_node(nodes.pop(victim), allow_graceful=False)
    thread.join(60)
    elapsed = time.monotonic() - killed_at
    outcome = result["outcome"]
    assert outcome.status == "failed"
    # every rank on the lost node dies with it: whichever is noticed first names the job's failure
    lost = [r["rank"] for r in _ranks(sink) if r["node_id"] == hung["node_id"]]
    assert any(outcome.error.startswith(f"rank {r} on node {hung['node_id']}") for r in lost), outcome.error
    assert elapsed < HEARTBEAT_TIMEOUT_S + 10, elapsed
    assert _leftovers() == ([], [])
