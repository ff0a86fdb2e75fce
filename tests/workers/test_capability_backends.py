"""The capability suite per backend: each named backend's capability check on the rank's device,
then its contract (an accepted request runs as the protocol promises; a refused one raises the
check's own reason). Run through `gdnval run capability` (the local executor, a rank process)
with the built-ins and three one-off `module:function` backends defined here: one that refuses
fp64 and keeps its word, one that claims fp64 and crashes on it, one that drops the initial
state's gradient. A broken contract is a failed case whose error is the contract's own words
(and the log says it too), never a crash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from click.testing import CliRunner

from gdn.backends import Backend
from gdn.backends.eager import eager_core


def _refuse_fp64(shape: Any, dtype: torch.dtype, device: torch.device) -> str | None:
    return "picky: no float64, use float32" if dtype == torch.float64 else None


PICKY = Backend("picky", eager_core, _refuse_fp64, module=__name__)


def crashes_on_fp64(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens):
    """Declares no check (so claims everything) and fails on fp64 inside its kernel."""
    if v.dtype == torch.float64:
        raise RuntimeError("kernel launch failed: no fp64 path")
    return eager_core(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def drops_h0_grad(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens):
    """Runs, but the initial state reaches the core detached: no gradient for it."""
    h0 = None if initial_state is None else initial_state.detach()
    return eager_core(q, k, v, g, beta, scale=scale, initial_state=h0,
                      output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def test_each_backend_keeps_its_capability_contract(tmp_path: Path) -> None:
    from service.cli import main

    mine = {f"{__name__}:{n}": n for n in ("PICKY", "crashes_on_fp64", "drops_h0_grad")}
    backends = ["eager", "triton", *mine]
    out = tmp_path / "run.json"
    res = CliRunner().invoke(main, [
        "run", "capability", "--preset", "quick", "--json", str(out), "--param", "process_checks=false",
        "--param", f"backends={json.dumps(backends)}", "--param", 'contract_dtypes=["float32","float64"]',
    ])
    doc = json.loads(out.read_text())
    assert res.exit_code == 1 and doc["verdict"] == "failed", res.output  # broken contracts fail the job
    got: dict[str, dict[str, float]] = {}
    for s in doc["samples"]:
        got.setdefault(s["case"], {})[s["metric"]] = s["value"]
    status = {c["name"]: c["status"] for c in doc["cases"]}

    def probe(b: str, kind: str) -> tuple[float, float, str]:
        name = f"backend_{b}_{kind}_d64"
        return got[name]["backend_supported"], got[name]["backend_contract"], status[name]

    kinds = ("float32", "float64", "packed_float32")
    for kind in kinds:
        assert probe("eager", kind) == (1.0, 1.0, "passed")
        assert probe("triton", kind) == (0.0, 1.0, "passed")  # refuses head dim 64 with its reason
        assert probe(f"{__name__}:drops_h0_grad", kind) == (1.0, 0.0, "failed")
    picky, crash = f"{__name__}:PICKY", f"{__name__}:crashes_on_fp64"
    kept, refused = (1.0, 1.0, "passed"), (0.0, 1.0, "passed")
    assert [probe(picky, k) for k in kinds] == [kept, refused, kept]
    assert [probe(crash, k) for k in kinds] == [kept, (1.0, 0.0, "failed"), kept]
    logs = "\n".join(doc["logs"])
    assert "refused: picky: no float64, use float32; contract kept" in logs
    assert "head_dim (k=64, v=64) is not supported by the Triton backend" in logs
    assert "CONTRACT BROKEN: the accepted request raised RuntimeError: kernel launch failed" in logs
    assert "CONTRACT BROKEN: no finite gradient for h0" in logs
    # the contract's own words are the failed case's error, beside the bound that broke
    errors = {c["name"]: c["error"] for c in doc["cases"]}
    crashed = errors[f"backend_{crash}_float64_d64"]
    assert crashed.startswith("CONTRACT BROKEN: the accepted request raised RuntimeError: kernel"), crashed
    assert "backend_contract worst 0 breaks bound >= 1" in crashed
    assert errors[f"backend_{__name__}:drops_h0_grad_float32_d64"].startswith("CONTRACT BROKEN: no finite")
    # the job records where each backend's code came from
    assert [b["backend"] for b in doc["info"]["backends"]] == backends
