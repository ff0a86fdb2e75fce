"""The README's figures command (scripts/readme_figures.py): a recorded run goes through a real
service into a store, and the plot and the screenshot are drawn from what the service stored."""

from __future__ import annotations

import json
import shutil
import statistics
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from scripts.readme_figures import PLOT_NAME, SHOT_NAME, VIEWPORT, RecordedRun, main, map_samples

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SVG = "{http://www.w3.org/2000/svg}"
CASES = [(65, "eager", 10.0), (65, "triton", 4.0), (130, "eager", 20.0), (130, "triton", 6.0)]


def _recorded_run(path: Path) -> dict[str, list[float]]:
    """A small gdn-op run in the `gdnval run --json` format; returns each case's fwd+bwd times."""
    times: dict[str, list[float]] = {}
    samples = []
    for t, backend, ms in CASES:
        name = f"T{t}_stateless_hqk1_hv2_b1_{backend}"
        times[name] = [ms * (1 + 0.01 * i) for i in (3, 0, 4, 1, 2)]  # median ms * 1.02
        samples += [{"case": name, "metric": "fwd_bwd_ms", "rank": 0, "idx": i, "value": v}
                    for i, v in enumerate(times[name])]
        samples.append({"case": name, "metric": "o_rel_l2", "rank": 0, "idx": 0, "value": 1e-7})
    doc = {
        "format": "gdnval-run/1", "suite": "gdn-op", "preset": "quick", "device": "cpu", "world_size": 1,
        "overrides": {"seq_lens": [65, 130], "modes": ["stateless"], "backends": ["eager", "triton"]},
        "commit": None, "status": "succeeded", "error": None, "info": {"device_name": "test cpu"},
        "cases": [{"name": n, "status": "passed", "error": None} for n in times], "samples": samples,
    }
    path.write_text(json.dumps(doc))
    return times


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
def test_the_command_writes_the_plot_and_the_screenshot_from_the_stored_job(tmp_path: Path) -> None:
    results = tmp_path / "run.json"
    times = _recorded_run(results)
    out = tmp_path / "img"
    assert main([str(results), "--out", str(out)]) == 0

    svg = ET.parse(out / PLOT_NAME).getroot()
    assert svg.find(f"{SVG}style") is not None  # the stylesheet's chart rules travel with the file
    lines = svg.findall(f"{SVG}polyline")
    assert len(lines) == 2  # one line per backend
    assert all(len(pl.get("points", "").split()) == 2 for pl in lines)  # one vertex per length
    desc = svg.find(f"{SVG}desc").text or ""
    for backend in ("eager", "triton"):  # the stored medians, summarised by the service
        meds = [statistics.median(times[f"T{t}_stateless_hqk1_hv2_b1_{backend}"]) for t in (65, 130)]
        assert f"{backend}: 65 {meds[0]:.4g} ms, 130 {meds[1]:.4g} ms" in desc, desc
    tips = [t.text for t in svg.iter(f"{SVG}title")]
    assert any(t and "spread" in t for t in tips)  # min..p90 of each case as its whisker

    png = (out / SHOT_NAME).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (VIEWPORT["width"], VIEWPORT["height"])


def test_a_recording_with_one_case_per_shape_maps_onto_todays_cases(tmp_path: Path) -> None:
    """Before the backend became a case parameter a case held every backend's metrics by prefix;
    they land on each backend's case, the ratio on the non-baseline one, the rest is counted."""
    shape = "T16384_stateful_hqk32_hv32_b1"
    recorded = [("triton_fwd_bwd_ms", 5.0), ("fla_fwd_bwd_ms", 4.0), ("ratio_to_fla", 1.25),
                ("old_metric", 1.0)]
    doc = {
        "format": "gdnval-run/1", "suite": "gdn-op", "preset": "full", "device": "cuda", "world_size": 1,
        "overrides": {"seq_lens": [16384], "modes": ["stateful"], "qk_heads": [32],
                      "backends": ["triton", "fla"]},
        "commit": None, "status": "succeeded", "error": None, "info": {}, "cases": [],
        "samples": [{"case": shape, "metric": m, "rank": 0, "idx": 0, "value": v} for m, v in recorded],
    }
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(doc))
    samples, left_out = map_samples(RecordedRun.load(path))
    got = {(s.case, s.metric, s.value) for rows in samples.values() for s in rows}
    assert got == {
        (f"{shape}_triton", "fwd_bwd_ms", 5.0),
        (f"{shape}_fla", "fwd_bwd_ms", 4.0),
        (f"{shape}_triton", "ratio_to_baseline", 1.25),
    }
    assert left_out == {"old_metric": 1}


def test_a_peers_benchmark_result_becomes_the_gdn_op_job_it_measured(tmp_path: Path) -> None:
    doc = {"backend": "ours", "versions": {"gpu": "NVIDIA H200", "torch": "2.11.0"},
           "command": "benchmarks/bench_gdn_peers.py --backend ours --seq-lens 8192 --qk-heads 32",
           "runs": [{"T": 8192, "hqk": 32, "fwd_ms": 0.66, "fwd_bwd_ms": 1.81, "fwd_bwd_ms_again": 1.80,
                     "peak_mib": 774.0, "rel_l2": {"o": 3e-3}, "variant": "default"},
                    {"T": 8192, "hqk": 32, "fwd_ms": 0.5, "fwd_bwd_ms": 1.5,
                     "variant": "swept"}]}
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(doc))
    run = RecordedRun.load(path)
    assert (run.suite, run.device, run.overrides["backends"], run.overrides["seq_lens"]) == (
        "gdn-op", "cuda", ["triton"], [8192])
    samples, left_out = map_samples(run)
    got = {s.metric: s.value for s in samples["T8192_stateful_hqk32_hv32_b1_triton"]}
    assert got == {"fwd_ms": 0.66, "fwd_bwd_ms": 1.80, "peak_bytes": 774.0 * 2**20, "o_rel_l2": 3e-3}
    assert not left_out  # the swept variant is not a default run: not taken at all
    with pytest.raises(ValueError, match="expected a 'gdnval-run/1' document"):
        (tmp_path / "other.json").write_text("[1, 2]")
        RecordedRun.load(tmp_path / "other.json")


def test_a_one_call_file_becomes_one_gdn_op_job_per_backend(tmp_path: Path) -> None:
    """benchmarks/gdn_one_call.py: each backend's processes are that backend's job, one sample per
    process (the repetition index), the peak and accuracy where a process measured them; ours
    first, variants left out, a backend without a result left out."""
    def process(backend: str, i: int, fb: float, extra: dict) -> dict:
        runs = [{"T": 8192, "hqk": 32, "fwd_ms": fb / 3, "fwd_bwd_ms": fb, "fwd_bwd_ms_again": fb + 0.1,
                 "variant": "default", **extra},
                {"T": 8192, "hqk": 32, "fwd_ms": 1.0, "fwd_bwd_ms": 9.0, "variant": "fused"}]
        result = {"versions": {"torch": "2.11"}, "runs": runs}
        return {"backend": backend, "process": i, "rc": 0, "result": result}

    doc = {"format": "gdn-one-call/1", "command": "benchmarks/gdn_one_call.py --out x.json",
           "machine": {"gpu": "NVIDIA H100", "driver": "580", "commit": "abc"}, "settings": {"v_heads": 32},
           "processes": [process("ours", 0, 2.0, {"peak_mib": 10.0, "rel_l2": {"o": 3e-3}}),
                         process("fla", 0, 3.0, {}), process("ours", 1, 2.5, {}),
                         {"backend": "flashqla", "process": 0, "rc": "timeout"}]}
    path = tmp_path / "call.json"
    path.write_text(json.dumps(doc))
    runs = RecordedRun.load_all(path)
    assert [r.overrides["backends"] for r in runs] == [["triton"], ["fla"]]
    assert runs[0].commit == "abc" and runs[0].info["device_name"] == "NVIDIA H100"
    samples, left_out = map_samples(runs[0])
    rows = samples["T8192_stateful_hqk32_hv32_b1_triton"]
    assert sorted((s.metric, s.idx, s.value) for s in rows if s.metric == "fwd_bwd_ms") == [
        ("fwd_bwd_ms", 0, 2.0), ("fwd_bwd_ms", 1, 2.5)]
    assert {s.metric for s in rows} == {"fwd_ms", "fwd_bwd_ms", "peak_bytes", "o_rel_l2"} and not left_out
