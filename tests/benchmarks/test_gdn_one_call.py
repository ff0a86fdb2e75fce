"""benchmarks/gdn_one_call.py and benchmarks/gdn_tables.py: the documented dry run (ours alone on
the CPU interpreter, two processes, a variant) runs exactly as written and writes the one raw
file the tables read; the tables' arithmetic on a file of several backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gdn_tables
from tests.support.doc_commands import documented_commands

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two interpreter processes of the whole op, fwd+bwd with accuracy (~70 s)
def test_the_documented_dry_run_writes_one_file_the_tables_read(tmp_path: Path) -> None:
    (cmd,) = [c for c in documented_commands() if "gdn_one_call.py --dry-run" in c.text]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    text = cmd.text.replace(".venv/bin/python", sys.executable).replace("/tmp/gdn-one-call-dry.json",
                                                                        str(tmp_path / "call.json"))
    proc = subprocess.run(text, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = gdn_tables.load(tmp_path / "call.json")
    assert {"host", "gpu", "driver", "commit", "code_hash"} <= doc["machine"].keys()
    assert doc["started_utc"] <= doc["ended_utc"] and doc["settings"]["processes"] == 2
    ran = [(p["backend"], p["process"], p["rc"]) for p in doc["processes"]]
    assert ran == [("ours", 1, 0), ("ours", 0, 0)]  # process 0, with accuracy and variants, last
    first = doc["processes"][1]["result"]["runs"]
    assert first[0]["differ_between_runs"] == [] and first[0]["worst_rel_l2"] < 3e-2  # fp16 at T = 65
    assert "rel_l2" not in doc["processes"][0]["result"]["runs"][0]  # accuracy: process 0 only
    variants = gdn_tables.variant_table(doc).splitlines()
    assert len(variants) == 3 and variants[2].startswith("| fused | 65, 1 |")


def _process(backend: str, i: int, fb: float, peak: float) -> dict:
    run = {"T": 16384, "hqk": 32, "fwd_ms": fb / 3, "fwd_bwd_ms": fb, "fwd_bwd_ms_again": fb * 1.01,
           "peak_mib": peak, "variant": "default"}
    if i == 0:
        run |= {"rel_l2": {"o": 1e-3, "dg": 3e-3}, "worst_rel_l2": 3e-3, "differ_between_runs": []}
    return {"backend": backend, "process": i, "rc": 0, "result": {"versions": {}, "runs": [run]}}


def test_the_tables_take_medians_over_processes_and_ratios_within_the_file() -> None:
    """A backend's figure is the median over its processes of each one's lower median; ratios
    divide figures of the same file; peak and accuracy come from the first process."""
    settings = {"processes": 3, "backends": "ours,fla,flashqla"}
    doc = {"format": "gdn-one-call/1", "machine": {}, "settings": settings,
           "processes": [_process("ours", 1, 3.2, 100.0), _process("fla", 1, 4.4, 200.0),
                         _process("flashqla", 1, 1.9, 50.0), _process("ours", 2, 2.9, 100.0),
                         _process("fla", 2, 4.2, 200.0),
                         {"backend": "flashqla", "process": 2, "rc": "timeout"},
                         _process("ours", 0, 3.0, 100.0), _process("fla", 0, 4.0, 200.0),
                         _process("flashqla", 0, 1.5, 50.0)]}  # the turns' order: process 0 last
    row = gdn_tables.bar_table(doc).splitlines()[2].split(" | ")
    ours, fla, qla = (gdn_tables.summary(gdn_tables.runs(doc)[(b, "default", (16384, 32))])
                      for b in ("ours", "fla", "flashqla"))
    assert (ours["fwd_bwd"], fla["fwd_bwd"], qla["fwd_bwd"], qla["processes"]) == (3.0, 4.2, 1.7, 2)
    want = [3.0 / 4.2, 3.0 / 1.7, 1.0 / 1.4, 1.0 / (3.4 / 6), 0.5]
    assert row[4:9] == [f"{w:.2f}" for w in want]
    assert "3.00e-03 (dg)" in row[9] and row[10] == "yes |"
    assert "flashqla 2 complete (#2 rc timeout)" in gdn_tables.header(doc)
    with pytest.raises(ValueError, match="expected 'gdn-one-call/1'"):
        gdn_tables.load(ROOT / "benchmarks" / "results" / "cp_layer_quick_cpu_w2.json")


def test_the_tables_name_every_measurement_that_failed_or_did_not_complete(tmp_path: Path) -> None:
    """A variant whose runs raised, a peer whose process timed out before a shape and a peer that
    never started each get a row with the file's reason; what was measured gets none."""
    ours = _process("ours", 0, 3.0, 100.0)
    ours["result"]["runs"] += [
        {"T": 16384, "hqk": 32, "variant": "narrow", "wall_s": 1.0,
         "error": "AcceleratorError: CUDA error: an illegal memory access was encountered\nSearch for ..."},
        dict(_process("ours", 0, 9.0, 50.0)["result"]["runs"][0], variant="fused")]
    fla = {"backend": "fla", "process": 0, "rc": "timeout", "wall_s": 140.0}
    settings = {"processes": 1, "backends": "ours,fla,flashqla", "seq_lens": "16384", "qk_heads": "32",
                "variant": ['fused={"fused":true}', 'narrow={"fused":true,"fused_bwd_bv":64}']}
    doc = {"format": "gdn-one-call/1", "machine": {}, "settings": settings, "processes": [ours, fla]}
    path = tmp_path / "call.json"
    path.write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gdn_tables.py"), str(path)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "not measured" in line or "failed" in line
            or "did not complete" in line or "not run" in line]
    assert rows == [
        "| backend or variant | T, Hqk | not measured |",
        "| narrow | 16K, 32 | failed: AcceleratorError: CUDA error: an illegal memory access was "
        "encountered |",
        "| fla | 16K, 32 | did not complete: #0 timeout after 140 s |",
        "| flashqla | 16K, 32 | not run: no process of flashqla in the file |"]
    assert "| fused | 16K, 32 | 3.000 | 9.000 | 3.000 |" in proc.stdout
    ours["result"]["runs"] = [r for r in ours["result"]["runs"] if "error" not in r]
    complete = dict(doc, processes=[ours], settings=dict(settings, backends="ours", variant=['fused={}']))
    assert gdn_tables.failure_table(complete) == ""


def test_variants_asked_at_their_own_lengths_are_expected_only_there() -> None:
    """`--variant-seq-lens`: a variant timed at the long shapes alone is complete there; the
    default's lengths it was never asked for are not reported as missing, and a length it was
    asked for but has no run is."""
    ours = _process("ours", 0, 3.0, 100.0)
    long = dict(ours["result"]["runs"][0], T=65536, variant="wk")
    ours["result"]["runs"] += [long]
    settings = {"processes": 1, "backends": "ours", "seq_lens": "16384,65536", "qk_heads": "32",
                "variant": ['wk={"walk_wk":true}'], "variant_seq_lens": "65536"}
    ours["result"]["runs"].insert(1, dict(ours["result"]["runs"][0], T=65536))
    doc = {"format": "gdn-one-call/1", "machine": {}, "settings": settings, "processes": [ours]}
    assert gdn_tables.failure_table(doc) == ""
    ours["result"]["runs"].remove(long)
    assert gdn_tables.failures(doc) == [
        ("ours", "wk", (65536, 32), "not run: absent from every process's result")]
