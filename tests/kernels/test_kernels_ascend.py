"""Every Triton kernel launch, lowered through triton-ascend 3.2's compiler front end on CPU.

triton-ascend installs as the `triton` package, so it lives in a venv of its own, `.venv-ascend`
(built by `scripts/bootstrap.sh test`; when it cannot be, the reason is in `.venv-ascend.skip`
and this module skips with it). The launches are the ones the sm_90 compile test walks
(`test_kernels_compile._distinct_launches`: the real wiring, forward and backward, packed and
not, every selectable variant), recorded here with the main environment's Triton and handed as
argument types and constexpr values to `tests/kernels/ascend_lower.py`, which runs in the Ascend
venv: each launch goes through the front end to TTIR, then through the bundled
`triton-adapter-opt` to Linalg, the input of CANN's `bishengir-compile` (the NPU binary needs
CANN, absent here). Results per kernel are in docs/kernels.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASCEND_PYTHON = ROOT / ".venv-ascend" / "bin" / "python"
SKIP_FILE = ROOT / ".venv-ascend.skip"  # written by the bootstrap with the reason it made no venv
WORKERS = 2  # CI's cores: the launches are split between two lowering processes

# Kernels every launch of which lowers to Linalg as written.
LOWERS = {
    "_gate_cumsum_kernel", "_state_fwd_kernel", "_output_kernel", "_dvn_local_kernel", "_state_bwd_kernel",
    "_bwd_dqk_kernel", "_bwd_wy_kernel", "_segment_fwd_summary_kernel", "_walk_operands_kernel",
    "_fused_fwd_kernel", "_bwd_dqk_wy_kernel",
}  # fmt: skip
# Kernels whose dot precision is a constexpr: their launches with "tf32" (the half-precision
# inputs' default) are refused by the front end, and lower with "hf32", Ascend's counterpart.
LOWERS_WITH_HF32 = {"_intra_kernel", "_wu_kernel"}
# Kernels that do not lower, and the construct the compiler names.
FAILS = {"_segment_scan_kernel": "input_precision == tf32 or tf32x3 is invalid"}
TF32_REFUSED = FAILS["_segment_scan_kernel"]


def _skip_reason() -> str | None:
    if SKIP_FILE.exists():
        return f"no triton-ascend venv: {SKIP_FILE.read_text().strip()}"
    if not ASCEND_PYTHON.exists():
        return "no triton-ascend venv (.venv-ascend): `bash scripts/bootstrap.sh test` builds it"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def recorded_launches() -> list[dict]:
    """The compile test's distinct launches of its dtypes, as JSON the Ascend driver reads:
    kernel module and name, argument types, constexpr values by parameter name."""
    from triton.compiler import make_backend

    from tests.kernels.test_kernels_compile import COMPILED_DTYPES, _distinct_launches, _target

    backend = make_backend(_target())
    out = []
    for dtype in COMPILED_DTYPES:
        for fn, signature, constexprs, _attrs, _options in _distinct_launches(dtype, False, backend):
            names = list(signature)
            values = {names[p[0]]: v for p, v in constexprs.items()}
            out.append({"module": fn.__module__, "kernel": fn.__name__, "dtype": str(dtype).split(".")[-1],
                        "signature": signature, "constexprs": values})  # fmt: skip
    return out


@pytest.fixture(scope="module")
def lowered() -> list[dict]:
    """One result per launch; recording and lowering run without TRITON_INTERPRET (under the
    interpreter the kernels are not compilable functions)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    rec = subprocess.run([sys.executable, "-m", "tests.kernels.test_kernels_ascend"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert rec.returncode == 0, rec.stderr[-4000:]
    launches = json.loads(rec.stdout.strip().splitlines()[-1])
    runs = []
    for w in range(WORKERS):
        proc = subprocess.Popen([str(ASCEND_PYTHON), "-m", "tests.kernels.ascend_lower"], cwd=ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        runs.append((proc, json.dumps(launches[w::WORKERS])))
    results = []
    for proc, given in runs:
        out, err = proc.communicate(given, timeout=900)
        assert proc.returncode == 0, err[-4000:]
        results.extend(json.loads(line) for line in out.splitlines() if line.startswith("{"))
    assert len(results) == len(launches), f"{len(results)} results for {len(launches)} launches"
    return results


def _failures(results: list[dict]) -> list[str]:
    return sorted({f"{r['kernel']} ({r['dtype']}, stopped after {r['stage']}): {r['construct']}"
                   for r in results if r["stage"] != "linalg"})  # fmt: skip


def per_kernel(results: list[dict]) -> dict[str, str]:
    """kernel -> "lowers", "lowers with hf32" or "fails: <construct>" over all its launches."""
    out: dict[str, str] = {}
    for r in results:
        if r["stage"] == "linalg":
            verdict = "lowers"
        elif r.get("ascend_stage") == "linalg":
            verdict = "lowers with hf32"
        else:
            verdict = f"fails: {r['construct']}"
        seen = out.get(r["kernel"], "lowers")  # a kernel's verdict is its worst launch's
        out[r["kernel"]] = max(seen, verdict, key=lambda v: ("lowers", "lowers with hf32").index(v)
                               if not v.startswith("fails") else 2)  # fmt: skip
    return out


def test_kernels_that_lower_keep_lowering(lowered: list[dict]) -> None:
    table = per_kernel(lowered)
    print("\n" + "\n".join(f"{k:30s} {v}" for k, v in sorted(table.items())))
    assert {k for k, v in table.items() if v == "lowers"} >= LOWERS & set(table), table
    for r in lowered:
        if r["kernel"] in LOWERS:
            assert r["stage"] == "linalg", f"{r['kernel']} ({r['dtype']}) no longer lowers: {r['construct']}"
            assert "linalg.fill" in r["linalg_ops"], r
    kernels = {r["kernel"] for r in lowered}
    assert kernels & LOWERS, f"no kernel of {sorted(LOWERS)} was launched; launched: {sorted(kernels)}"
    # the dots (tl.dot) of the chunked kernels reach Linalg as matmuls
    assert any("linalg.matmul" in r["linalg_ops"] for r in lowered if r["kernel"] == "_output_kernel")


def test_tf32_dots_lower_as_hf32(lowered: list[dict]) -> None:
    for r in lowered:
        if r["kernel"] in LOWERS_WITH_HF32:
            if r["stage"] == "linalg":
                continue
            assert TF32_REFUSED in r["construct"], r
            assert r["ascend_constexprs"] and set(r["ascend_constexprs"].values()) == {"hf32"}, r
            assert r["ascend_stage"] == "linalg", f"{r['kernel']} with hf32: {r['ascend_construct']}"
    refused = {r["kernel"] for r in lowered if r["kernel"] in LOWERS_WITH_HF32 and r["stage"] != "linalg"}
    assert refused, "no launch of the precision-constexpr kernels asked for tf32"


def test_every_failure_is_a_known_kernel_and_construct(lowered: list[dict]) -> None:
    """A kernel that stops lowering, or a new kernel that does not lower, fails here naming the
    kernel and the construct the compiler refused."""
    known = [r for r in lowered if r["kernel"] in LOWERS_WITH_HF32
             or (r["kernel"] in FAILS and FAILS[r["kernel"]] in (r["construct"] or ""))]  # fmt: skip
    unknown = _failures([r for r in lowered if r not in known])
    assert not unknown, "launches that do not lower to Linalg:\n" + "\n".join(unknown)
    for kernel in FAILS.keys() & {r["kernel"] for r in lowered}:  # still failing as recorded
        assert any(r["kernel"] == kernel and r["stage"] != "linalg" for r in lowered), f"{kernel} lowers now"


if __name__ == "__main__":
    print(json.dumps(recorded_launches()))
