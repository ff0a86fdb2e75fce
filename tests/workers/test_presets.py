"""Preset definitions: every preset of every suite can reach a verdict with its evidence, and
the CPU presets with a world size fit the world sizes they are run at."""

from __future__ import annotations

import pytest

from workers import verdict
from workers.registry import SUITE_MODULES, get_suite

BUILT_IN = sorted(n for n, module in SUITE_MODULES.items() if module.startswith("workers.suites."))


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_preset_takes_enough_repetitions_for_significance(name: str) -> None:
    suite = get_suite(name)
    need = verdict.repeats_for_significance(verdict.ALPHA)
    for preset in suite.presets:
        reps = suite.time_repeats(suite.resolve_params(preset))
        assert reps is not None, f"suite {name!r} has repeated time metrics but does not say how many"
        assert reps == 0 or reps >= need, (
            f"{name} preset {preset!r} takes {reps} repetition(s) per time metric; Mann-Whitney at "
            f"alpha={verdict.ALPHA} needs at least {need} per side"
        )


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_device_kind_has_a_gate_preset(name: str) -> None:
    suite = get_suite(name)
    for device in suite.devices:
        assert suite.gate_presets[device] in suite.presets


# Parameters that name core backends (cp-layer's candidates are '<mode>+<backend>')
BACKEND_FIELDS = ("backend", "backends", "ref_backend", "reference_backend", "baseline", "candidates")


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_backend_a_preset_runs_is_named_for_its_provenance(name: str) -> None:
    """The ranks record where each backend's code came from (`Suite.backends`): every backend a
    preset's parameters name is among those."""
    suite = get_suite(name)
    for preset in suite.presets:
        params = suite.resolve_params(preset)
        named: set[str] = set()
        for key, value in params.model_dump().items():
            if key in BACKEND_FIELDS and value is not None:
                values = [value] if isinstance(value, str) else list(value)
                named |= {v.partition("+")[2] if key == "candidates" else v for v in values}
        assert named <= set(suite.backends(params)), (preset, sorted(named), suite.backends(params))


def test_cp_layer_quick_heads_split_over_two_four_and_eight_ranks() -> None:
    suite = get_suite("cp-layer")
    p = suite.resolve_params("quick")
    for world in (2, 4, 8):
        assert p.qk_heads % world == 0 and p.v_heads % world == 0


@pytest.mark.slow
def test_cp_layer_quick_passes_on_four_cpu_ranks(tmp_path) -> None:
    """`gdnval run cp-layer --preset quick --device cpu --world-size 4` exits 0: every case fits
    but AllGather over the packed batch, whose sequence across a rank boundary it cannot carry:
    skipped, not applicable, with that reason."""
    import json
    import subprocess
    import sys

    out = tmp_path / "cp4.json"
    cmd = [sys.executable, "-m", "service.cli", "run", "cp-layer", "--preset", "quick", "--device", "cpu",
           "--world-size", "4", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "passed" and len(doc["cases"]) == 21
    not_passed = {c["name"]: (c["status"], c["error"]) for c in doc["cases"] if c["status"] != "passed"}
    assert set(not_passed) == {"all_gather_eager_T160_B1_packed4_float64"}
    for status, why in not_passed.values():
        assert status == "skipped", (status, why)
        assert "not applicable at world size 4: CP mode 'all_gather' with packed" in why, why


@pytest.mark.slow  # a job on rank processes
def test_a_case_that_cannot_apply_at_the_world_size_is_skipped_with_its_reason(tmp_path) -> None:
    """Ulysses with 3 heads on 2 ranks cannot split them: recorded as skipped (not applicable),
    the job's verdict stays passed, and P2P on the same shapes runs."""
    import json
    import subprocess
    import sys

    from workers.suite import Case

    stab = get_suite("stability")
    uly, p2p = (Case("stability", f"passes/{m}", {"mode": m, "model": "tiny"}) for m in ("ulysses", "p2p"))
    assert "divisible by the CP size 4" in (stab.not_applicable(uly, 4) or "")
    assert stab.not_applicable(p2p, 4) is None and stab.not_applicable(uly, 2) is None

    out = tmp_path / "misfit.json"
    cmd = [sys.executable, "-m", "service.cli", "run", "cp-layer", "--world-size", "2",
           "--param", "qk_heads=3", "--param", "v_heads=3", "--param", 'dtypes=["float64"]',
           "--param", 'candidates=["ulysses+eager","p2p+eager"]', "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    status = {c["name"]: (c["status"], c["error"] or "") for c in doc["cases"]}
    for name, (st, why) in status.items():
        if name.startswith("ulysses"):
            assert st == "skipped" and "not applicable at world size 2" in why, (name, st, why)
        else:
            assert st == "passed", (name, st, why)
    assert doc["verdict"] == "passed"
