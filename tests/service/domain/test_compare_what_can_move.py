"""Only what can move is judged: on a cpu raw wall clock is shown, never judged (the reference-
relative times are); on any device a time of two jobs whose code under test is byte-identical is
shown, never judged. One rule (`workers.verdict.time_not_judged`) applied by the compare engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from service.domain.compare import CaseInfo, JobRef, JobSide, SampleTable, compare
from workers import verdict
from workers.provenance import code_identity, content_hash
from workers.suite import Metric

RAW = Metric("fwd_ms", "ms", "time", bound=50.0)  # bounded, so a broken bound would show
REL = Metric("fwd_rel", "x ref", "time", min_effect=verdict.REFERENCE_RELATIVE_MIN_EFFECT)
ACC = Metric("o_rel_l2", "", "accuracy", bound=1e-2)
METRICS = {m.name: m for m in (RAW, REL, ACC)}


def _side(job_id: int, scale: float, device: str, code: str | None, seed: int, err: float = 1e-4) -> JobSide:
    rng = np.random.default_rng(seed)
    rows = [("c", name, 0, i, float(base * scale * (1 + 0.01 * rng.standard_normal())))
            for name, base in (("fwd_ms", 30.0), ("fwd_rel", 2.0)) for i in range(20)]
    rows.append(("c", "o_rel_l2", 0, 0, err))
    ref = JobRef(job_id, "synthetic", "gate-cpu", device=device, code=code)
    return JobSide(ref, {"c": CaseInfo("c", "case")}, METRICS, SampleTable.from_records(rows))


def _verdicts(base: JobSide, head: JobSide) -> tuple[dict[str, str], bool]:
    cmp = compare(base, head)
    (case,) = cmp.cases
    return {m.metric: m.verdict for m in case.metrics}, cmp.passed


def test_on_a_cpu_a_doubled_raw_time_is_shown_and_the_relative_one_judged() -> None:
    got, passed = _verdicts(_side(1, 1.0, "cpu", "x", 1), _side(2, 2.5, "cpu", "y", 2))
    assert got == {"fwd_ms": "changed", "fwd_rel": "regressed", "o_rel_l2": "unchanged"}
    assert not passed
    # the raw time breaks its 50 ms bound at head (75 ms) and still does not fail: never judged
    raw_only = {**METRICS, "fwd_rel": replace(REL, min_effect=None)}
    base, head = _side(1, 1.0, "cpu", "x", 1), _side(2, 2.5, "cpu", "y", 2)
    base.metrics, head.metrics = raw_only, raw_only
    got, passed = _verdicts(base, head)
    assert got["fwd_ms"] == "changed" and got["fwd_rel"] == "changed" and passed


def test_on_a_gpu_the_raw_time_is_judged() -> None:
    got, _ = _verdicts(_side(1, 1.0, "cuda", "x", 1), _side(2, 2.0, "cuda", "y", 2))
    assert got["fwd_ms"] == "failed"  # its bound, 60 ms > 50 ms
    got, _ = _verdicts(_side(1, 1.0, "cuda", "x", 1), _side(2, 1.3, "cuda", "y", 2))
    assert got == {"fwd_ms": "regressed", "fwd_rel": "regressed", "o_rel_l2": "unchanged"}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_byte_identical_code_never_fails_on_time_but_still_on_accuracy(device: str) -> None:
    cmp = compare(_side(1, 1.0, device, "same", 1), _side(2, 2.5, device, "same", 2))
    (case,) = cmp.cases
    by = {m.metric: m for m in case.metrics}
    assert by["fwd_rel"].verdict == "changed" and by["fwd_ms"].verdict == "changed"
    assert "byte-identical" in by["fwd_rel"].reason and by["fwd_rel"].ratio == pytest.approx(2.5, rel=0.05)
    assert cmp.passed and not cmp.time_regressions()
    worse = compare(_side(1, 1.0, device, "same", 1), _side(2, 1.0, device, "same", 2, err=5e-3))
    assert not worse.passed  # an accuracy change is never the machine's


def test_unknown_code_on_either_side_is_never_identical() -> None:
    got, passed = _verdicts(_side(1, 1.0, "cpu", None, 1), _side(2, 2.5, "cpu", None, 2))
    assert got["fwd_rel"] == "regressed" and not passed


def test_code_identity_is_the_runtime_and_every_backend(tmp_path: Path) -> None:
    info = {"code_hash": "a", "backends": [{"backend": "eager", "content_hash": "a"},
                                           {"backend": "mine", "content_hash": "m1"}]}
    same = code_identity(info)
    assert same is not None and same == code_identity(dict(info))
    other = {**info, "backends": [info["backends"][0], {"backend": "mine", "content_hash": "m2"}]}
    assert code_identity(other) != same
    assert code_identity({**info, "code_hash": None}) is None
    assert code_identity({"code_hash": "a", "backends": [{"backend": "x", "error": "gone"}]}) is None
    assert code_identity(None) is None


def test_content_hash_sees_every_byte_and_ignores_bytecode(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "ops.py").write_text("def f():\n    return 1\n")
    first = content_hash([pkg])
    (pkg / "__pycache__" / "ops.cpython-312.pyc").write_bytes(b"\x00")
    assert content_hash([pkg]) == first
    (pkg / "ops.py").write_text("def f():\n    return 1  # a comment\n")
    assert content_hash([pkg]) != first
    assert content_hash([tmp_path / "absent"]) is None


def test_the_rule_names_why() -> None:
    assert verdict.time_not_judged(None, "cpu") is not None
    assert verdict.time_not_judged(0.25, "cpu") is None
    assert verdict.time_not_judged(None, "cuda") is None
    assert "byte-identical" in (verdict.time_not_judged(0.25, "cuda", same_code=True) or "")
