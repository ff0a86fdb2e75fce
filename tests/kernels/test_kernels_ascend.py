"""Every Triton kernel launch, lowered through triton-ascend 3.2's compiler front end on CPU.

triton-ascend installs as the `triton` package, so it lives in a venv of its own, `.venv-ascend`
(built by `scripts/bootstrap.sh test`; when it cannot be, the reason is in `.venv-ascend.skip`
and this module skips with it). The launches are the ones the sm_90 compile test walks
(`test_kernels_compile._distinct_launches`: the real wiring, forward and backward, packed and
not, every selectable variant) under the NPU launch config (`config.NPU_FIELDS`: the dot
precisions triton-ascend accepts), recorded here with the main environment's Triton and handed as
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
# The triton-ascend venv: ROOT/.venv-ascend, or the one GDN_ASCEND_VENV names (a checkout without
# its own, e.g. a second worktree, lowering through another's, which it only reads)
ASCEND_VENV = Path(os.environ.get("GDN_ASCEND_VENV") or ROOT / ".venv-ascend")
ASCEND_PYTHON = ASCEND_VENV / "bin" / "python"
SKIP_FILE = ROOT / ".venv-ascend.skip"  # written by the bootstrap with the reason it made no venv
WORKERS = 2  # CI's cores: the launches are split between two lowering processes

# Kernels every launch of which lowers to Linalg as written, under the NPU launch config.
LOWERS = {
    "_gate_cumsum_kernel", "_intra_t_kernel", "_intra_wu_kernel", "_state_fwd_kernel", "_output_kernel",
    "_dvn_local_kernel",
    "_state_bwd_kernel", "_bwd_dqk_kernel", "_bwd_wy_kernel", "_segment_fwd_summary_kernel",
    "_segment_scan_kernel", "_fused_fwd_kernel", "_fused_maps_kernel", "_fused_bwd_kernel",
    "_fused_dmaps_kernel",
}
# Constexprs that are a dot's input precision, per kernel: under the NPU config none is tf32 or
# tf32x3, which the front end refuses ("please use input_precision='hf32' on Ascend").
PRECISION_CONSTEXPRS = {k: "PREC" for k in (
    "_intra_t_kernel", "_intra_wu_kernel", "_segment_scan_kernel", "_fused_fwd_kernel", "_fused_maps_kernel",
    "_fused_bwd_kernel", "_fused_dmaps_kernel")} | {
    "_state_fwd_kernel": "PREC", "_segment_fwd_summary_kernel": "PREC",  # U or Vn formed in the walk
    "_state_bwd_kernel": "PREC_WU"}  # Wk formed in the reverse walk


def _skip_reason() -> str | None:
    if SKIP_FILE.exists() and "GDN_ASCEND_VENV" not in os.environ:
        return f"no triton-ascend venv: {SKIP_FILE.read_text().strip()}"
    if not ASCEND_PYTHON.exists():
        return f"no triton-ascend venv ({ASCEND_VENV}): `bash scripts/bootstrap.sh test` builds it"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def recorded_launches() -> list[dict]:
    """The compile test's distinct launches of its dtypes, as JSON the Ascend driver reads:
    kernel module and name, argument types, constexpr values by parameter name."""
    from triton.compiler import make_backend

    from kernels.gdn.config import NPU_FIELDS, config_overrides
    from tests.kernels.test_kernels_compile import COMPILED_DTYPES, _distinct_launches, _target

    backend = make_backend(_target())
    out = []
    with config_overrides(**NPU_FIELDS):
        launches = [(dtype, launch) for dtype in COMPILED_DTYPES
                    for launch in _distinct_launches(dtype, False, backend)]
    for dtype, (fn, signature, constexprs, _attrs, _options) in launches:
        names = list(signature)
        values = {names[p[0]]: v for p, v in constexprs.items()}
        out.append({"module": fn.__module__, "kernel": fn.__name__, "dtype": str(dtype).split(".")[-1],
                    "signature": signature, "constexprs": values})
    return out


@pytest.fixture(scope="module")
def lowered() -> list[dict]:
    """One result per launch; recording and lowering run without TRITON_INTERPRET (under the
    interpreter the kernels are not compilable functions)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    rec = subprocess.run([sys.executable, "-m", "tests.kernels.test_kernels_ascend"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert rec.returncode == 0, rec.stderr[-4000:]
    launches = json.loads(rec.stdout.strip().splitlines()[-1])
    runs = []
    for w in range(WORKERS):
        proc = subprocess.Popen([str(ASCEND_PYTHON), "-m", "tests.kernels.ascend_lower"], cwd=ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
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
                   for r in results if r["stage"] != "linalg"})


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
                               if not v.startswith("fails") else 2)
    return out


def test_every_kernel_lowers_under_the_npu_config(lowered: list[dict]) -> None:
    """Every launch reaches Linalg as recorded; a kernel that stops lowering fails here naming the
    kernel and the construct the compiler refused."""
    table = per_kernel(lowered)
    print("\n" + "\n".join(f"{k:30s} {v}" for k, v in sorted(table.items())))
    failed = _failures(lowered)
    assert not failed, "launches that do not lower to Linalg:\n" + "\n".join(failed)
    assert set(table) == LOWERS, f"kernels launched: {sorted(table)}"
    assert all(r["linalg_ops"] for r in lowered), "a lowered launch without Linalg ops"
    # the dots (tl.dot) of the chunked kernels reach Linalg as matmuls
    assert any("linalg.matmul" in r["linalg_ops"] for r in lowered if r["kernel"] == "_output_kernel")


def test_npu_config_sets_the_dot_precisions_ascend_accepts(lowered: list[dict]) -> None:
    """The precision constexprs of the launches: hf32 for the intra products of half-precision
    inputs (U's, Vn's and Wk's too, where a walk forms them), IEEE for fp32 ones and for the
    segment scan; never tf32 or tf32x3."""
    seen = {}
    for r in lowered:
        name = PRECISION_CONSTEXPRS.get(r["kernel"])
        if name is None:
            assert not {"tf32", "tf32x3"} & set(map(str, r["constexprs"].values())), r
            continue
        seen.setdefault((r["kernel"], r["dtype"]), set()).add(r["constexprs"][name])
    fused = {"_fused_fwd_kernel", "_fused_maps_kernel", "_fused_bwd_kernel", "_fused_dmaps_kernel"}
    walks = {"_state_fwd_kernel", "_segment_fwd_summary_kernel", "_state_bwd_kernel"}  # U, Vn or Wk
    assert seen == {("_intra_t_kernel", "bfloat16"): {"hf32"}, ("_intra_t_kernel", "float32"): {"ieee"},
                    ("_intra_wu_kernel", "bfloat16"): {"hf32"}, ("_intra_wu_kernel", "float32"): {"ieee"},
                    ("_segment_scan_kernel", "bfloat16"): {"ieee"},
                    ("_segment_scan_kernel", "float32"): {"ieee"},
                    **{(k, "bfloat16"): {"hf32"} for k in walks},
                    **{(k, "float32"): {"ieee"} for k in walks},
                    **{(k, "bfloat16"): {"hf32"} for k in fused},
                    **{(k, "float32"): {"ieee"} for k in fused}}, seen


if __name__ == "__main__":
    print(json.dumps(recorded_launches()))
