"""Campaign plans (workers.plans): every plan loads, expands for each of its devices at its world
sizes into jobs that pass the job submission's own validation, and refuses what it cannot run."""

from __future__ import annotations

import pytest

from service.domain.submission import JobCreate, validate_request
from workers.executors.local import LocalExecutor
from workers.plans import ENTRY_LABEL, Plan, PlanError, load_plan, parse_plan, plan_names
from workers.registry import get_suite

# the report's sections: a plan that loses one no longer produces the report
SECTIONS = {"capability", "gdn-op", "cp-layer", "network", "stability", "profile"}


class AnyDevices(LocalExecutor):
    """The local executor with 8 ranks of every device kind: validation as on a GPU host."""

    def max_world_size(self, device: str) -> int:
        return 8


def test_the_plans_are_the_report_its_cpu_size_and_its_single_device_part() -> None:
    assert plan_names() == ["pr-report", "pr-report-1gpu", "pr-report-cpu"]
    gpu, cpu, one = load_plan("pr-report"), load_plan("pr-report-cpu"), load_plan("pr-report-1gpu")
    assert set(gpu.devices) == set(one.devices) == {"cuda", "npu"} and cpu.devices == ("cpu",)
    for plan in (gpu, cpu):
        assert plan.version >= 1 and plan.world_sizes == (4, 8)
        assert {e.section for e in plan.jobs} == SECTIONS
    # one device: every section but stability, which needs two ranks
    assert one.world_sizes == (1,) and {e.section for e in one.jobs} == SECTIONS - {"stability"}


@pytest.mark.parametrize("name", ["pr-report", "pr-report-cpu", "pr-report-1gpu"])
def test_every_job_of_every_plan_validates_as_a_submitted_job(name: str) -> None:
    plan = load_plan(name)
    executor = AnyDevices()
    for device in plan.devices:
        jobs = plan.expand(device)
        keys = [j.key for j in jobs]
        assert len(set(keys)) == len(keys)
        per_size = [j for j in jobs if "@" in j.key]
        assert {j.world_size for j in per_size} <= {4, 8}
        for job in jobs:
            req = validate_request(JobCreate.model_validate({**job.job_body()}, strict=False), executor)
            assert (req.suite, req.world_size, req.device) == (job.suite, job.world_size, device)
            assert req.labels[ENTRY_LABEL] == job.key
            assert job.check_cases() >= 1


def test_cpu_plan_runs_ulysses_at_cp4_and_cp8() -> None:
    """The tiny model's overridden heads split over 8 ranks: no Ulysses case of the network,
    stability, profile or cp-layer jobs is skipped at either world size."""
    ulysses_by_size: dict[int, int] = {4: 0, 8: 0}
    for job in load_plan("pr-report-cpu").expand("cpu"):
        suite = get_suite(job.suite)
        cases = suite.cases(suite.resolve_params(job.preset, job.params, device="cpu"))
        for case in cases:
            if case.params.get("mode") == "ulysses":
                assert suite.not_applicable(case, job.world_size) is None, (job.key, case.name)
                ulysses_by_size[job.world_size] += 1
    assert ulysses_by_size[4] >= 4 and ulysses_by_size[4] == ulysses_by_size[8]


def test_tiny_model_without_overrides_keeps_its_case_fingerprints() -> None:
    """`model_overrides` joins a case's parameters only when set, so stored series stay comparable."""
    suite = get_suite("network")
    plain = suite.cases(suite.resolve_params("quick"))
    assert all("model_overrides" not in c.params for c in plain)
    heads = {"linear_num_qk_heads": 8, "linear_num_v_heads": 8}
    changed = suite.cases(suite.resolve_params("quick", {"model_overrides": heads}))
    assert changed[0].params["model_overrides"] == heads
    assert changed[0].fingerprint("cpu", 4) != plain[0].fingerprint("cpu", 4)
    with pytest.raises(Exception, match="linear_num_qk_heads"):
        suite.resolve_params("quick", {"model_overrides": {"heads": 8}})


def test_gpu_plan_carries_the_reports_lengths_and_peers() -> None:
    jobs = {j.key: j for j in load_plan("pr-report").expand("cuda", backends=["fla", "flashqla"])}
    assert jobs["network-4l@4"].params["seq_len"] == 65536
    assert jobs["network-4l@8"].params["seq_len"] == 131072
    assert jobs["network-4l@4"].params["steps"] == 200 and jobs["network-8l@4"].params["steps"] == 100
    assert jobs["gdn-op"].params["backends"] == ["eager", "triton", "fla", "flashqla"]
    assert jobs["cp-layer@8"].params["padding_cases"] == [[2, 8192, 7777]]
    # on an NPU the plan keeps Triton (through triton-ascend) as a preset does; AllGather stays eager
    npu = {j.key: j for j in load_plan("pr-report").expand("npu")}
    assert npu["gdn-op"].params["backends"] == ["eager", "triton"]
    assert npu["cp-layer@4"].params["candidates"] == ["ulysses+triton", "p2p+triton", "all_gather+eager"]


def test_single_device_plan_runs_the_core_with_peers_and_the_p2p_emulation_on_one_rank() -> None:
    jobs = {j.key: j for j in load_plan("pr-report-1gpu").expand("cuda", backends=["fla", "flashqla"])}
    assert {j.world_size for j in jobs.values()} == {1}
    assert jobs["gdn-op"].params["backends"] == ["eager", "triton", "fla", "flashqla"]
    assert jobs["cp-layer"].params["candidates"] == ["p2p_emulated+triton"]
    assert jobs["network-4l"].params["steps"] == 200 and jobs["network-4l"].params["modes"] == ["none"]
    # the 200-step eager reference it names is the recorded one, for exactly this run
    from workers.plans import PLAN_DIR

    assert (PLAN_DIR.parent.parent / str(jobs["network-4l"].params["reference_file"])).is_file()


def test_plan_refusals_name_the_choices() -> None:
    choices = r"unknown plan 'nope'; expected one of \['pr-report', 'pr-report-1gpu', 'pr-report-cpu'\]"
    with pytest.raises(PlanError, match=choices):
        load_plan("nope")
    with pytest.raises(PlanError, match="runs on \\['cpu'\\], not on device 'cuda'"):
        load_plan("pr-report-cpu").expand("cuda")
    with pytest.raises(PlanError, match="world sizes \\[4, 8\\], not for 2"):
        load_plan("pr-report-cpu").expand("cpu", [2])
    doc = load_plan("pr-report-cpu").document()
    assert isinstance(parse_plan(doc), Plan)
    with pytest.raises(PlanError, match="entries named twice"):
        parse_plan({**doc, "jobs": [doc["jobs"][0], doc["jobs"][0]]})
    with pytest.raises(PlanError, match="version"):
        parse_plan({**doc, "version": 0})
