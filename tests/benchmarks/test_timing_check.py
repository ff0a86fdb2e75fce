"""benchmarks/timing_check.py on a CPU: the suite's own timing beside the do_bench method for the
eager backend at a small size, a backend that cannot run listed with its reason, rows of
several processes merged into one table, and the verdict rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.timing_check import main, merge, parse_args, table, verdict

SMALL = ["--device", "cpu", "--seq-lens", "64", "--qk-heads", "1", "--v-heads", "2", "--head-dim", "16",
         "--dtype", "float32", "--warmup", "1", "--repeat", "3", "--warmup-ms", "2",
         "--rep-ms", "10"]


def test_cpu_run_measures_the_suite_and_the_reference_method(
    tmp_path: Path, one_torch_thread: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "timing.json"
    rc = main([*SMALL, "--backends", "eager,flashqla", "--out", str(out), "--tolerance", "1e9"])
    assert rc == 0  # a skipped backend is no failure; the tolerance lets any CPU ratio pass
    rows = {r["backend"]: r for r in json.loads(out.read_text())["rows"]}
    eager = rows["eager"]
    assert eager["T"] == 64 and eager["pass"] is True
    for key in ("suite_ms", "do_bench_ms", "suite_call_ms"):
        assert eager[key] > 0, key
    assert eager["ratio"] == pytest.approx(eager["suite_ms"] / eager["do_bench_ms"])
    assert "flash_qla" in rows["flashqla"]["skipped"] and "suite_ms" not in rows["flashqla"]
    printed = capsys.readouterr().out.splitlines()
    head = next(i for i, ln in enumerate(printed) if ln.split()[:2] == ["T", "backend"])
    assert "within 100000000000%" in printed[head]
    lines = printed[head + 1 :]
    assert any(ln.split()[:2] == ["64", "eager"] and "PASS" in ln for ln in lines)
    assert any(ln.split()[:2] == ["64", "flashqla"] and "skipped" in ln for ln in lines)

    # a second process (another backend, another PYTHONPATH) adds its rows to the same file
    assert main([*SMALL, "--backends", "no-such-backend", "--out", str(out), "--tolerance", "1e9"]) == 0
    doc = json.loads(out.read_text())
    assert {r["backend"] for r in doc["rows"]} == {"eager", "flashqla", "no-such-backend"}
    unknown = next(r for r in doc["rows"] if r["backend"] == "no-such-backend")
    assert "registered backends" in unknown["skipped"]
    assert len(doc["commands"]) == 2
    assert doc["device"]["device_kind"] == "cpu" and doc["backends"]["eager"]["distribution"] == "gdnval"
    assert "error" in doc["backends"]["no-such-backend"]
    capsys.readouterr()
    assert main(["--print", "--out", str(out)]) == 0  # what the session prints last: every row
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith("within 100000000000%") and len(printed) == 4
    assert main(["--print", "--out", str(tmp_path / "none.json")]) == 1  # nothing measured fails


def test_verdicts_table_and_merge() -> None:
    ok = {"T": 16384, "backend": "fla", "suite_ms": 3.7, "do_bench_ms": 3.68, "suite_call_ms": 3.69,
          "ratio": 3.7 / 3.68, "pass": True}
    slow = {"T": 16384, "backend": "flashqla", "suite_ms": 2.345, "do_bench_ms": 1.39, "suite_call_ms": 1.9,
            "ratio": 2.345 / 1.39, "pass": False}
    broken = {"T": 65536, "backend": "triton", "error": "RuntimeError: out of memory"}
    assert [verdict(r) for r in (ok, slow, broken)] == ["PASS", "FAIL", "ERROR"]
    text = table([broken, slow, ok], 0.10).splitlines()
    assert text[0].split()[:2] == ["T", "backend"] and text[0].endswith("within 10%")
    assert [ln.split()[1] for ln in text[1:]] == ["fla", "flashqla", "triton"]  # by T, then backend
    assert text[2].split()[2:6] == ["2.345", "1.390", "1.900", "1.69"] and "FAIL" in text[2]
    assert "ERROR RuntimeError: out of memory" in text[3] and text[3].split()[2] == "-"
    again = dict(slow, suite_ms=1.4, ratio=1.4 / 1.39, **{"pass": True})
    merged = merge([ok, slow, broken], [again])
    assert len(merged) == 3 and merged[-1] is again  # the same (T, backend) replaced, others kept


def test_arguments_name_what_is_missing() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--out", "x.json", "--backends", ""])
    args = parse_args(["--out", "x.json"])
    assert args.backend_list == ["triton", "fla", "flashqla"] and args.lens == [16384, 65536]
    assert (args.qk_heads, args.v_heads, args.head_dim, args.dtype) == (32, 32, 128, "bfloat16")


def test_compile_only_runs_each_call_once_and_writes_nothing(
    tmp_path: Path, one_torch_thread: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "timing.json"
    assert main([*SMALL, "--backends", "eager,fla", "--out", str(out), "--compile-only"]) == 0
    assert not out.exists()
    printed = capsys.readouterr().out
    assert "T=64 eager: compiled in" in printed
    assert "T=64 fla: skipped: backend 'fla' is not installed" in printed
