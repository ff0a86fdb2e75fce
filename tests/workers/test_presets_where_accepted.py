"""Every preset runs where it is accepted: for each suite, preset, device kind and world size 1-8
that a submission accepts, every case either fits (gdn's own shard and head rules hold on every
rank) or is skipped with its reason; a preset none of whose cases fits is refused at submit."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from service.domain import submission
from workers.registry import SUITE_MODULES, get_suite
from workers.suite import Case, Suite

BUILT_IN = sorted(n for n, module in SUITE_MODULES.items() if module.startswith("workers.suites."))
DEVICES = ("cpu", "cuda", "npu")
WORLD_SIZES = range(1, 9)


def _gdn_refusal(case: Case, world_size: int) -> str | None:
    """What the system under test raises for this case at this world size, asked of gdn itself
    (the oracle: shard_range on every rank, the Ulysses head split, the Conv1D halo)."""
    from gdn.cp.config import CP_MODES, CPError, shard_range, ulysses_misfit

    p = case.params
    mode = p.get("mode")
    if mode not in CP_MODES or mode == "none":
        return None
    if world_size == 1:
        return f"{mode} on one rank"
    try:
        for rank in range(world_size):
            start, end = shard_range(int(p["seq_len"]), world_size, rank)
            if "conv_size" in p and end - start < p["conv_size"] - 1:
                return f"shard {end - start} shorter than the Conv1D halo"
    except CPError as exc:
        return str(exc)
    if mode == "ulysses" and "qk_heads" in p:
        return ulysses_misfit(p["qk_heads"], p["v_heads"], world_size)
    return None


def _accepted(name: str, preset: str, device: str, world_size: int) -> bool:
    body = {"suite": name, "preset": preset, "device": device, "world_size": world_size}
    try:
        submission.validate_request(body, None)
    except submission.InvalidJob:
        return False
    return True


def _combos() -> Iterator[tuple[Suite, str, str, int]]:
    for name in BUILT_IN:
        suite = get_suite(name)
        for preset in suite.presets:
            for device in DEVICES:
                for world_size in WORLD_SIZES:
                    yield suite, preset, device, world_size


def test_every_accepted_preset_holds_only_cases_that_fit_or_are_skipped() -> None:
    accepted = refused = skipped = 0
    for suite, preset, device, world_size in _combos():
        cases = suite.cases(suite.resolve_params(preset, device=device))
        ok = _accepted(suite.name, preset, device, world_size)
        reasons = {c.name: suite.why_not_here(c, world_size) for c in cases}
        runnable = [c for c in cases if reasons[c.name] is None]
        where = f"{suite.name} {preset} on {device} at world size {world_size}"
        if device not in suite.devices or world_size < suite.min_world_size:
            assert not ok, where
            continue
        # accepted exactly when some case fits by its parameters alone
        assert ok == (len(suite.misfits(cases, world_size)) < len(cases)), where
        if not ok:
            refused += 1
            continue
        accepted += 1
        assert runnable, f"{where}: accepted, yet every case is skipped"
        for case in runnable:
            why = _gdn_refusal(case, world_size)
            assert why is None, f"{where}: case {case.name} would error: {why}"
        skipped += len(cases) - len(runnable)
    # the walk saw both sides of the rule
    assert accepted > 100 and refused > 0 and skipped > 0, (accepted, refused, skipped)


@pytest.mark.parametrize(
    ("suite", "preset", "world_size", "needle"),
    [
        ("profile", "quick", 1, "CP mode 'ulysses' needs a job with world size >= 2 (got 1)"),
        ("network", "quick", 1, "none of its 13 case(s) can run at world size 1"),
        ("profile", "quick", 3, "sequence length 128 is not divisible by the CP size 3"),
    ],
)
def test_a_preset_no_case_of_which_runs_is_refused_with_the_reason(
    suite: str, preset: str, world_size: int, needle: str
) -> None:
    body = {"suite": suite, "preset": preset, "device": "cpu", "world_size": world_size}
    with pytest.raises(submission.InvalidJob, match="none of its") as exc:
        submission.validate_request(body, None)
    assert needle in str(exc.value)


def test_a_bad_case_matrix_is_the_request_s_fault() -> None:
    body = {"suite": "cp-layer", "params": {"candidates": ["warp+eager"]}}
    with pytest.raises(submission.InvalidJob, match="bad candidate 'warp\\+eager'"):
        submission.validate_request(body, None)


def test_the_default_cpu_gate_takes_the_suites_with_a_case_at_its_world_size() -> None:
    from service.domain.gate import GateRequest, validate_gate

    one = validate_gate(GateRequest(head="a" * 40, base="b" * 40, device="cpu"))
    assert "profile" in one and "stability" not in one  # profile traces the no-CP network on one rank
    two = validate_gate(GateRequest(head="a" * 40, base="b" * 40, device="cpu", world_size=2))
    assert "stability" in two


def _run(tmp_path: Any, *args: str) -> dict[str, Any]:
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "service.cli", "run", *args, "--device", "cpu", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow  # rank processes
def test_profile_gate_cpu_on_one_rank_traces_without_cp_and_skips_the_cp_modes(tmp_path: Any) -> None:
    doc = _run(tmp_path, "profile", "--preset", "gate-cpu")
    status = {c["name"]: (c["status"], c["error"] or "") for c in doc["cases"]}
    assert status["trace/none"] == ("passed", "")
    for mode in ("ulysses", "p2p", "all_gather"):
        st, why = status[f"trace/{mode}"]
        assert st == "skipped", (mode, st, why)
        assert f"CP mode '{mode}' needs a job with world size >= 2" in why, why
    assert doc["verdict"] == "passed"


@pytest.mark.slow  # three rank processes
def test_cp_layer_quick_on_three_ranks_runs_what_fits_and_skips_the_rest(tmp_path: Any) -> None:
    doc = _run(tmp_path, "cp-layer", "--preset", "quick", "--world-size", "3")
    status = {c["name"]: (c["status"], c["error"] or "") for c in doc["cases"]}
    assert len(status) == 21 and doc["verdict"] == "passed"
    skipped = {n: why for n, (st, why) in status.items() if st == "skipped"}
    assert all(st == "passed" for n, (st, _) in status.items() if n not in skipped)
    assert any("sequence length 128 is not divisible by the CP size 3" in why for why in skipped.values())
    assert all(n.split("_")[0] in ("ulysses", "p2p", "all") for n in skipped), sorted(skipped)
