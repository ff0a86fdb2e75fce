"""The judgment (`service.domain.compare.judgment`): diagnostics never judged, an accuracy change
measured against the base and the reference backend's own error, and the difference rule for two
sets of repetitions inside one job."""

from __future__ import annotations

import numpy as np
import pytest

from service.domain.compare import (
    CaseInfo,
    JobRef,
    JobSide,
    SampleTable,
    compare,
    difference,
    within_bound_text,
)
from workers import verdict
from workers.stats import summarise
from workers.suite import Metric

REL_L2 = Metric("o_rel_l2", "ratio", "accuracy", bound=5e-3)
MAX_REL = Metric("o_max_rel", "ratio", "accuracy", diagnostic=True)
METRICS = {m.name: m for m in (REL_L2, MAX_REL)}


def _side(values: dict[tuple[str, str], list[float]], params: dict[str, dict], job_id: int) -> JobSide:
    records = [(fp, metric, 0, i, v) for (fp, metric), vs in values.items() for i, v in enumerate(vs)]
    cases = {fp: CaseInfo(fp, fp, p) for fp, p in params.items()}
    return JobSide(JobRef(job_id, "gdn-op", "gate-cpu"), cases, METRICS, SampleTable.from_records(records))


PARAMS = {"mine": {"seq_len": 512, "backend": "mine"}, "eager": {"seq_len": 512, "backend": "eager"}}


def _verdicts(base: dict, head: dict) -> dict[tuple[str, str], str]:
    cmp = compare(_side(base, PARAMS, 1), _side(head, PARAMS, 2))
    return {(c.fingerprint, m.metric): m.verdict for c in cmp.cases for m in c.metrics}


def test_a_reduction_order_change_is_unchanged_and_its_max_rel_is_only_recorded() -> None:
    """The tile-size case: rel-L2 3.3e-7 against 2.3e-7 and max-rel x9: nothing to judge."""
    base = {("mine", "o_rel_l2"): [2.3e-7], ("mine", "o_max_rel"): [0.031],
            ("eager", "o_rel_l2"): [2.0e-7], ("eager", "o_max_rel"): [0.318]}
    head = {("mine", "o_rel_l2"): [3.3e-7], ("mine", "o_max_rel"): [0.284],
            ("eager", "o_rel_l2"): [2.0e-7], ("eager", "o_max_rel"): [0.318]}
    got = _verdicts(base, head)
    assert got[("mine", "o_rel_l2")] == "unchanged"
    assert got[("mine", "o_max_rel")] == "changed"  # recorded: never failing, never an improvement


def test_an_output_scaled_within_its_bound_is_worsened_against_base_and_eager() -> None:
    """Output x (1 + 2e-3): rel-L2 2e-3, inside the 5e-3 bound, far above base and eager."""
    base = {("mine", "o_rel_l2"): [2.3e-7], ("eager", "o_rel_l2"): [2.0e-7]}
    head = {("mine", "o_rel_l2"): [2.0e-3], ("eager", "o_rel_l2"): [2.0e-7]}
    assert _verdicts(base, head)[("mine", "o_rel_l2")] == "worsened"


def test_within_the_reference_factor_of_eager_an_accuracy_change_is_unchanged() -> None:
    """A 20x move above the floor, but within 10x of eager's own error in the same job: unchanged."""
    metric = Metric("x_rel_l2", "ratio", "accuracy", bound=1e-4)  # floor 1e-5
    metrics = {metric.name: metric}

    def side(mine: float, job_id: int) -> JobSide:
        records = [("mine", "x_rel_l2", 0, 0, mine), ("eager", "x_rel_l2", 0, 0, 5e-6)]
        cases = {fp: CaseInfo(fp, fp, p) for fp, p in PARAMS.items()}
        return JobSide(JobRef(job_id, "gdn-op", "q"), cases, metrics, SampleTable.from_records(records))

    (mine,) = [c for c in compare(side(1e-6, 1), side(2e-5, 2)).cases if c.fingerprint == "mine"]
    assert mine.metrics[0].verdict == "unchanged"
    assert "eager" in mine.metrics[0].reason
    (mine,) = [c for c in compare(side(1e-6, 1), side(9e-5, 2)).cases if c.fingerprint == "mine"]
    assert mine.metrics[0].verdict == "worsened"


def test_a_diagnostic_never_fails_a_case_even_when_non_finite() -> None:
    stats = summarise([0.5, float("inf")], "lower", metric="o_max_rel", kind="accuracy", diagnostic=True)
    judged = verdict.judge_metric(MAX_REL, stats)
    assert judged.ok is None and "diagnostic" in judged.reason
    assert verdict.judge_metric(REL_L2, summarise([1e-7, float("nan")], "lower")).ok is False


def test_a_diagnostic_cannot_carry_a_bound_and_a_suite_must_declare_unbounded_errors() -> None:
    with pytest.raises(ValueError, match="diagnostic with bound"):
        Metric("o_max_rel", "ratio", "accuracy", bound=1.0, diagnostic=True)
    from workers.suite import Suite

    with pytest.raises(TypeError, match=r"\['o_max_abs'\] have no bound"):
        type("Loose", (Suite,), {"name": "loose", "metrics": (Metric("o_max_abs", "abs", "accuracy"),)})


def test_stored_definitions_without_a_declaration_follow_the_rule() -> None:
    assert verdict.is_diagnostic("accuracy", None, None) is True
    assert verdict.is_diagnostic("trajectory", None, None) is True
    assert verdict.is_diagnostic("accuracy", 5e-3, None) is False
    assert verdict.is_diagnostic("time", None, None) is False
    assert verdict.is_diagnostic("check", None, True) is True


def test_difference_claims_a_separated_pair_and_not_an_overlapping_one() -> None:
    rng = np.random.default_rng(3)
    ulysses = 10.0 * (1 + 0.02 * rng.standard_normal(20))
    p2p_far = 8.0 * (1 + 0.02 * rng.standard_normal(20))
    p2p_near = 10.0 * (1 + 0.30 * rng.standard_normal(20))
    far = difference(ulysses, p2p_far, device="cuda")
    assert far.significant and far.verdict == "better"
    gain, lo, hi = far.gain()
    assert 0.15 < lo <= gain <= hi < 0.25
    assert far.describe("gain").startswith("+")
    near = difference(ulysses, p2p_near, device="cuda")
    assert not near.significant
    assert near.describe("gain").startswith("no significant difference (95% CI")


def test_difference_with_two_repetitions_never_concludes() -> None:
    d = difference([10.0, 10.1], [5.0, 5.1], device="cuda")
    assert d.p_value is None and not d.significant
    assert "too few repetitions" in d.describe("speedup")


def test_difference_on_a_cpu_needs_a_doubling_for_raw_wall_clock() -> None:
    rng = np.random.default_rng(4)
    a = 10.0 * (1 + 0.01 * rng.standard_normal(20))
    b = 7.0 * (1 + 0.01 * rng.standard_normal(20))
    assert difference(a, b, device="cuda").significant
    assert not difference(a, b, device="cpu").significant  # 1.43x, within the cpu's doubling
    assert difference(a, b / 2, device="cpu").significant


def test_errors_of_two_modes_are_read_against_their_bound() -> None:
    assert within_bound_text(1e-5, {"p2p": 3.1e-7, "ulysses": 6.4e-9}) == (
        "both within 1e-05: p2p 3.1e-07, ulysses 6.4e-09"
    )
    assert within_bound_text(1e-7, {"p2p": 3.1e-7, "ulysses": 6.4e-9}).startswith("p2p breaks the bound")


@pytest.mark.parametrize("direction", ["lower", "higher"])
def test_a_one_value_time_is_recorded_by_direction_and_effect(direction: str) -> None:
    from service.domain.compare import CompareConfig
    from service.domain.compare.judgment import Rule, memory_change, recorded_change

    one_value = Metric("ratio", "x", "time", direction, min_effect=0.2, repeated=False)
    rule = Rule.of(one_value, CompareConfig(), "cuda")
    up, down = recorded_change(10.0, 13.0, rule)[0], recorded_change(10.0, 7.0, rule)[0]
    assert (up, down) == (("changed", "improved") if direction == "lower" else ("improved", "changed"))
    assert recorded_change(10.0, 11.0, rule)[0] == "unchanged"
    assert recorded_change(10.0, float("nan"), rule)[0] == "changed"
    # memory below 1 MiB of growth never counts, whatever the ratio
    mem = Rule.of(Metric("peak", "bytes", "memory"), CompareConfig(), "cuda")
    assert memory_change(1000.0, 5000.0, mem)[0] == "unchanged"
