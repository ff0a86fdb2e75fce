"""`capability` on the ranks: each case's check (the cases: `workers.suites.capability.spec`).

Fresh-interpreter checks run on rank 0 only; they import the `gdn` the rank imported (the job's
snapshot, when there is one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gdn
from gdn import GDNShape, UnsupportedGDNRequest, gated_delta_rule, get_backend, is_triton_gdn_available
from gdn.cp import CPConfig, all_gather_gated_delta_rule
from workers.context import RankContext
from workers.packaging_check import check_wheel
from workers.suite import Case, CaseFailed, Sample
from workers.suites.capability.spec import ERROR, PROBE_HQK, PROBE_HV, PROBE_T

SUBPROCESS_TIMEOUT_S = 300


def run(ctx: RankContext, case: Case) -> Iterator[Sample]:
    check = case.params["check"]
    if check == "triton_available":
        yield from _triton_available(ctx, case)
    elif check == "failfast":
        _failfast(ctx, case)
    elif check == "backend_contract":
        yield from _backend_contract(ctx, case)
    elif ctx.rank != 0:
        return  # fresh-interpreter checks: once per job
    elif check == "lazy_import":
        loaded = _fresh_python(_LAZY_IMPORT)["loaded"]
        if loaded:
            print(f"import gdn loaded {loaded}", file=sys.stderr)
        yield Sample(case.name, "modules_loaded_by_import_gdn", float(len(loaded)), rank=ctx.rank)
    elif check == "eager_without_triton":
        res = _fresh_python(_EAGER_WITHOUT_TRITON)
        yield Sample(case.name, "eager_no_triton_max_abs", float(res["max_abs"]), rank=ctx.rank)
        ok = res["error_type"] == ERROR and not res["triton_loaded"] and not res["triton_found"]
        yield Sample(case.name, "eager_no_triton_failfast", 1.0 if ok else 0.0, rank=ctx.rank)
    elif check == "wheel":
        yield from _wheel(ctx, case)
    else:
        raise ValueError(f"unknown capability check {check!r}")


def _triton_available(ctx: RankContext, case: Case) -> Iterator[Sample]:
    shape = GDNShape(*case.params["shape"])
    ok = is_triton_gdn_available(shape, device=ctx.device)
    metric = "triton_available" if ctx.device_kind in ("cuda", "npu") else "triton_available_recorded"
    yield Sample(case.name, metric, 1.0 if ok else 0.0, rank=ctx.rank)


def _failfast(ctx: RankContext, case: Case) -> None:
    p = case.params
    d = int(p.get("head_dim", 128))
    dtype = torch.bfloat16 if ctx.device_kind != "cpu" else torch.float32
    T, H = 64, 2
    q = torch.randn(1, T, H, d, device=ctx.device, dtype=dtype)
    k = F.normalize(torch.randn(1, T, H, d, device=ctx.device, dtype=dtype), dim=-1)
    v = torch.randn(1, T, H, d, device=ctx.device, dtype=dtype)
    g = -torch.rand(1, T, H, device=ctx.device, dtype=torch.float32)
    beta = torch.rand(1, T, H, device=ctx.device, dtype=torch.float32)
    try:
        if p.get("cp") == "all_gather":
            _all_gather_triton(ctx, q, k, v, g, beta)
        else:
            chunk = int(p.get("chunk_size", 64))
            gated_delta_rule(q, k, v, g, beta, backend=p["backend"], chunk_size=chunk)
    except UnsupportedGDNRequest as exc:
        if p["reason"] not in str(exc):
            raise AssertionError(
                f"raised {type(exc).__name__} for the wrong reason: expected the message to name "
                f"{p['reason']!r}, got: {exc}"
            ) from exc
        raise


def _wheel(ctx: RankContext, case: Case) -> Iterator[Sample]:
    root = _source_root()
    with tempfile.TemporaryDirectory(prefix="gdnval-wheel-") as work:
        result = check_wheel(root, work)
    for problem in result.problems:
        print(f"wheel check: {problem}", file=sys.stderr)
    yield Sample(case.name, "wheel_kernel_modules", float(len(result.kernel_files)), rank=ctx.rank)
    yield Sample(case.name, "wheel_installs_and_imports", 1.0 if result.ok else 0.0, rank=ctx.rank)
    if not result.ok:
        raise RuntimeError("wheel check failed: " + "; ".join(result.problems))


def _backend_contract(ctx: RankContext, case: Case) -> Iterator[Sample]:
    """The backend's check for the probe, then whether the backend keeps what the check said."""
    p = case.params
    name, d, packed = p["backend"], int(p["head_dim"]), p.get("packed")
    dtype: torch.dtype = getattr(torch, p["dtype"])
    n = len(packed) if packed else None
    shape = GDNShape(1, PROBE_T, PROBE_HQK, PROBE_HV, d, d, n)
    broken: str | None
    reason: str | None
    try:
        reason = get_backend(name).unsupported(shape, dtype, ctx.device)
    except Exception as exc:  # a check that crashes says nothing: the contract is broken
        broken = f"its capability check raised {type(exc).__name__}: {exc}"
        reason = None
    else:
        broken = _keeps_refusal(ctx, p, reason) if reason is not None else _keeps_claim(ctx, p)
    print(f"{case.name}: " + (f"refused: {reason}" if reason is not None else "accepted")
          + (f"; CONTRACT BROKEN: {broken}" if broken else "; contract kept"), file=sys.stderr)
    yield Sample(case.name, "backend_supported", 0.0 if reason is not None else 1.0, rank=ctx.rank)
    yield Sample(case.name, "backend_contract", 0.0 if broken else 1.0, rank=ctx.rank)
    if broken:  # the contract's own words reach the case, the job page and the gate
        raise CaseFailed(f"CONTRACT BROKEN: {broken}")


@dataclass
class Probe:
    """A contract probe's leaves on the rank's device, each requiring grad, and its packed offsets."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    h0: torch.Tensor
    cu: torch.Tensor | None

    def leaves(self) -> dict[str, torch.Tensor]:
        return {"q": self.q, "k": self.k, "v": self.v, "g": self.g, "beta": self.beta, "h0": self.h0}


def _probe(ctx: RankContext, p: Mapping[str, Any]) -> Probe:
    """Small leaves in the probe's dtype (g in fp32, the states in fp32, fp64 for fp64)."""
    gen = torch.Generator().manual_seed(0)
    dt: torch.dtype = getattr(torch, p["dtype"])
    d, packed = int(p["head_dim"]), p.get("packed")
    sdt = torch.float64 if dt == torch.float64 else torch.float32
    n = len(packed) if packed else 1

    def rnd(*shape: int, dtype: torch.dtype = dt) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.to(ctx.device).requires_grad_(True)

    T, hq, hv = PROBE_T, PROBE_HQK, PROBE_HV
    return Probe(
        q=leaf(rnd(1, T, hq, d)), k=leaf(F.normalize(rnd(1, T, hq, d, dtype=sdt), dim=-1).to(dt)),
        v=leaf(rnd(1, T, hv, d)), g=leaf(F.logsigmoid(rnd(1, T, hv, dtype=sdt) + 2).float()),
        beta=leaf(torch.sigmoid(rnd(1, T, hv, dtype=sdt)).to(dt)), h0=leaf(0.1 * rnd(n, hv, d, d, dtype=sdt)),
        cu=torch.tensor([0, *torch.tensor(packed).cumsum(0).tolist()], dtype=torch.int32,
                        device=ctx.device) if packed else None,
    )


def _call_backend(p: Mapping[str, Any], x: Probe) -> tuple[torch.Tensor, torch.Tensor | None]:
    return gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                            cu_seqlens=x.cu, backend=p["backend"])


def _keeps_claim(ctx: RankContext, p: Mapping[str, Any]) -> str | None:
    """None when the accepted request runs as the protocol promises, else what went wrong."""
    x = _probe(ctx, p)
    try:
        o, ht = _call_backend(p, x)
        if tuple(o.shape) != tuple(x.v.shape) or o.dtype != x.v.dtype:
            return f"output {tuple(o.shape)} {o.dtype}, expected {tuple(x.v.shape)} {x.v.dtype}"
        if ht is None or tuple(ht.shape) != tuple(x.h0.shape):
            return f"final state {None if ht is None else tuple(ht.shape)}, expected {tuple(x.h0.shape)}"
        if not (torch.isfinite(o).all() and torch.isfinite(ht).all()):
            return "non-finite output or final state"
        (o.float().sum() + ht.float().sum()).backward()
    except Exception as exc:
        return f"the accepted request raised {type(exc).__name__}: {str(exc)[:500]}"
    missing = [k for k, t in x.leaves().items() if t.grad is None or not torch.isfinite(t.grad).all()]
    return f"no finite gradient for {', '.join(missing)}" if missing else None


def _keeps_refusal(ctx: RankContext, p: Mapping[str, Any], reason: str) -> str | None:
    """None when the refused request raises UnsupportedGDNRequest with the check's reason."""
    try:
        _call_backend(p, _probe(ctx, p))
    except UnsupportedGDNRequest as exc:
        return None if reason in str(exc) else f"refused for another reason: {exc} (its check said: {reason})"
    except Exception as exc:
        return f"crashed with {type(exc).__name__}: {str(exc)[:500]} instead of refusing: {reason}"
    return f"ran a request its check refuses ({reason}): a silent fall-back"


def _all_gather_triton(
    ctx: RankContext, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> None:
    """CP all_gather with backend='triton' through the real entry, on a 1-rank group if needed."""
    if dist.is_initialized():
        cp = CPConfig(mode="all_gather", group=ctx.group)
        all_gather_gated_delta_rule(q, k, v, g, beta, cp, backend="triton")
        return
    with tempfile.TemporaryDirectory(prefix="gdnval-pg-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            all_gather_gated_delta_rule(q, k, v, g, beta, CPConfig(mode="all_gather"), backend="triton")
        finally:
            dist.destroy_process_group()


def _source_root() -> Path:
    """The tree this rank imports `gdn` from: the job's snapshot or the installed source."""
    return Path(gdn.__file__).resolve().parent.parent


def _fresh_python(code: str) -> dict[str, Any]:
    """The JSON object the last line of `code`'s output holds, run in a fresh interpreter that
    imports this rank's `gdn` first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_source_root()), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, env=env, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"fresh interpreter failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


_LAZY_IMPORT = """
import json, sys
import gdn
print(json.dumps({"loaded": sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'kernels'))}))
"""

_EAGER_WITHOUT_TRITON = """
import importlib.util, json, sys

class HideTriton:
    # Wraps every finder so that `triton` is simply not found, as if it were not installed.
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'triton':
            return None
        find = getattr(self.inner, 'find_spec', None)
        return find(name, path, target) if find else None
    def __getattr__(self, attr):
        return getattr(self.inner, attr)

sys.meta_path[:] = [HideTriton(f) for f in sys.meta_path]
import torch
import gdn
from gdn.reference import recurrent_gated_delta_rule
torch.manual_seed(0)
B, T, H, D = 1, 100, 2, 16
q = torch.randn(B, T, H, D)
k = torch.nn.functional.normalize(torch.randn(B, T, H, D), dim=-1)
v = torch.randn(B, T, H, D)
g = -torch.rand(B, T, H) * 0.5
beta = torch.rand(B, T, H)
o, _ = gdn.gated_delta_rule(q, k, v, g, beta, backend='eager', output_final_state=True)
ref, _ = recurrent_gated_delta_rule(q.double(), k.double(), v.double(), g.double(), beta.double())
error_type = None
try:
    gdn.gated_delta_rule(q, k, v, g, beta, backend='triton')
except Exception as exc:
    error_type = type(exc).__name__
print(json.dumps({
    "max_abs": (o.double() - ref).abs().max().item(),
    "error_type": error_type,
    "triton_loaded": 'triton' in sys.modules,
    "triton_found": importlib.util.find_spec('triton') is not None,
}))
"""
