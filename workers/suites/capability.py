"""`capability`: can this machine run the Triton GDN backend, and does the package behave.

Cases:
- `triton_available_T{T}_hqk{H}`: `is_triton_gdn_available` on the production shapes. Required
  (bound 1) on CUDA and on NPU (triton-ascend); recorded without a bound on CPU, where Triton does
  not compile the kernels. The report took official results only after this returned True.
- `failfast_*`: each unsupported request raises `UnsupportedGDNRequest` at once, for the right
  reason (a wrong reason is an error, not a pass): `backend="auto"`, head_dim != 128 with Triton,
  chunk_size != 64 with Triton, and CP `all_gather` with Triton.
- `import_gdn_is_lazy`: `import gdn` in a fresh interpreter loads neither triton nor kernels.
- `eager_without_triton`: with Triton made unimportable the eager backend still matches the
  recurrent oracle, and asking for Triton raises the clear error.
- `wheel_contains_kernels` (gate/full): the built wheel in an isolated venv has the kernels.
- `backend_<name>_<dtype>_d<D>` (and `..._packed_...`), for each of `backends` (any registered
  name or `module:function`): the backend's capability check on the rank's device for that
  dtype, head dim (and a packed batch), then its contract: a request it claims runs and meets
  the protocol (output and final state shaped and typed as promised, finite, a gradient for every
  input, the initial state included); a request it refuses raises `UnsupportedGDNRequest` with the
  check's own reason through `gdn.gated_delta_rule`. A crash, a silent run of a refused request or
  a missing gradient breaks the contract (`backend_contract` = 0): a failed case, never a crash.

Fresh-interpreter checks run on rank 0 only; they import the `gdn` the rank imported (the job's
snapshot, when there is one).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from workers.context import RankContext
from workers.suite import (
    CPU_GATE_PRESETS,
    Case,
    DType,
    Metric,
    Positive,
    Sample,
    Suite,
    SuiteParams,
    check_backend_names,
)

ERROR = "UnsupportedGDNRequest"
SUBPROCESS_TIMEOUT_S = 300


class CapabilityParams(SuiteParams):
    batch: Positive = 1
    seq_lens: tuple[Positive, ...] = (8192, 16384, 32768, 65536)
    qk_heads: tuple[Positive, ...] = (16, 32)
    v_heads: Positive = 32
    head_dim: Positive = 128
    process_checks: bool = True  # fresh-interpreter import checks
    wheel: bool = False  # build + install the wheel (tens of seconds)
    backends: tuple[str, ...] = ("eager", "triton")  # each one's capability check and contract
    contract_dtypes: tuple[DType, ...] = ("bfloat16", "float32", "float64")
    contract_head_dims: tuple[Positive, ...] = (128, 64)
    contract_packed: bool = True  # one probe of a packed batch (cu_seqlens) per backend


def _gdn_tree() -> Path | None:
    """The directory holding the `gdn` package, found without importing it (no torch here)."""
    spec = importlib.util.find_spec("gdn")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _has_all_gather_cp() -> bool:
    tree = _gdn_tree()
    init = tree / "cp" / "__init__.py" if tree else None
    return bool(init and init.is_file() and "all_gather_gated_delta_rule" in init.read_text())


class CapabilitySuite(Suite):
    name = "capability"
    gate_presets = CPU_GATE_PRESETS
    description = (
        "Triton GDN capability on the production shapes, fail-fast errors, lazy import, "
        "eager without Triton, wheel contents"
    )
    params_model = CapabilityParams
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # the quick probes are the cheap ones: fp64 at head dim 64 runs on eager and is refused
        # by Triton (whose interpreter would take seconds per claimed request)
        "quick": {"wheel": False, "contract_dtypes": ("float64",), "contract_head_dims": (64,)},
        "gate-cpu": {"wheel": False, "contract_dtypes": ("float32", "float64")},
        "gate": {"wheel": True},
        "full": {"wheel": True},
    }
    metrics = (
        Metric("triton_available", "bool", "check", "higher", bound=1.0,
               description="is_triton_gdn_available on CUDA and NPU: must be True"),
        Metric("triton_available_recorded", "bool", "check", "higher",
               description="is_triton_gdn_available where Triton is not expected (CPU)"),
        Metric("modules_loaded_by_import_gdn", "count", "check", "lower", bound=0.0,
               description="triton/kernels modules in sys.modules after `import gdn`"),
        Metric("eager_no_triton_max_abs", "abs", "accuracy", "lower", bound=1e-4,
               description="eager backend vs the fp64 oracle with Triton unimportable (fp32)"),
        Metric("eager_no_triton_failfast", "bool", "check", "higher", bound=1.0,
               description="backend='triton' raises UnsupportedGDNRequest when Triton is missing"),
        Metric("wheel_kernel_modules", "count", "check", "higher", bound=2.0,
               description="kernels/*.py files in the wheel (including __init__)"),
        Metric("wheel_installs_and_imports", "bool", "check", "higher", bound=1.0,
               description="the wheel installs into an isolated venv and `import gdn, kernels` works there"),
        Metric("backend_supported", "bool", "check", "higher",
               description="the backend's capability check accepts the request (recorded, no bound)"),
        Metric("backend_contract", "bool", "check", "higher", bound=1.0,
               description="accepted: runs and meets the protocol; refused: raises its own reason"),
    )  # fmt: skip

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, CapabilityParams)
        out = [
            Case(self.name, f"triton_available_T{t}_hqk{h}",
                 {"check": "triton_available", "shape": [params.batch, t, h, params.v_heads,
                                                         params.head_dim, params.head_dim]})
            for t in params.seq_lens for h in params.qk_heads
        ]  # fmt: skip
        failfast = [
            ("failfast_backend_auto", {"backend": "auto"}, "backend='auto'"),
            ("failfast_head_dim_64_triton", {"backend": "triton", "head_dim": 64}, "head_dim"),
            ("failfast_chunk_size_32_triton", {"backend": "triton", "chunk_size": 32}, "chunk_size"),
        ]
        if _has_all_gather_cp():
            failfast.append(
                ("failfast_all_gather_triton", {"backend": "triton", "cp": "all_gather"}, "all_gather")
            )
        # TODO(cp): without gdn.cp.all_gather_gated_delta_rule the all_gather+triton case is left out.
        for name, args, reason in failfast:
            params_ = {"check": "failfast", **args, "reason": reason}
            out.append(Case(self.name, name, params_, expected_error=ERROR))
        if params.process_checks:
            out.append(Case(self.name, "import_gdn_is_lazy", {"check": "lazy_import"}))
            out.append(Case(self.name, "eager_without_triton", {"check": "eager_without_triton"}))
        if params.wheel:
            out.append(Case(self.name, "wheel_contains_kernels", {"check": "wheel"}))
        return out + self._backend_cases(params)

    def backends(self, params: SuiteParams) -> tuple[str, ...]:
        assert isinstance(params, CapabilityParams)
        return tuple(params.backends)

    def _backend_cases(self, params: CapabilityParams) -> list[Case]:
        check_backend_names(params.backends)
        if len(set(params.backends)) != len(params.backends):
            raise ValueError(f"backends {list(params.backends)} name a backend twice")
        probes = [(dt, d, None) for dt in params.contract_dtypes for d in params.contract_head_dims]
        if params.contract_packed and probes:
            probes.append((probes[0][0], probes[0][1], list(PACKED_PROBE)))
        return [
            Case(self.name, f"backend_{b}_{'packed_' if packed else ''}{dt}_d{d}",
                 {"check": "backend_contract", "backend": b, "dtype": dt, "head_dim": d, "packed": packed})
            for b in params.backends for dt, d, packed in probes
        ]  # fmt: skip

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        check = case.params["check"]
        if check == "triton_available":
            yield from self._triton_available(ctx, case)
        elif check == "failfast":
            self._failfast(ctx, case)
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
            yield from self._wheel(ctx, case)
        else:
            raise ValueError(f"unknown capability check {check!r}")

    def _triton_available(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        from gdn import GDNShape, is_triton_gdn_available

        shape = GDNShape(*case.params["shape"])
        ok = is_triton_gdn_available(shape, device=ctx.device)
        metric = "triton_available" if ctx.device_kind in ("cuda", "npu") else "triton_available_recorded"
        yield Sample(case.name, metric, 1.0 if ok else 0.0, rank=ctx.rank)

    def _failfast(self, ctx: RankContext, case: Case) -> None:
        import torch

        from gdn import UnsupportedGDNRequest, gated_delta_rule

        p = case.params
        d = int(p.get("head_dim", 128))
        dtype = torch.bfloat16 if ctx.device_kind != "cpu" else torch.float32
        T, H = 64, 2
        q = torch.randn(1, T, H, d, device=ctx.device, dtype=dtype)
        k = torch.nn.functional.normalize(torch.randn(1, T, H, d, device=ctx.device, dtype=dtype), dim=-1)
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

    def _wheel(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        from workers.packaging_check import check_wheel

        root = _source_root()
        with tempfile.TemporaryDirectory(prefix="gdnval-wheel-") as work:
            result = check_wheel(root, work)
        for problem in result.problems:
            print(f"wheel check: {problem}", file=sys.stderr)
        yield Sample(case.name, "wheel_kernel_modules", float(len(result.kernel_files)), rank=ctx.rank)
        yield Sample(case.name, "wheel_installs_and_imports", 1.0 if result.ok else 0.0, rank=ctx.rank)
        if not result.ok:
            raise RuntimeError("wheel check failed: " + "; ".join(result.problems))


PACKED_PROBE = (1, 63)  # a one-token sequence, then one a token short of a chunk
PROBE_T, PROBE_HQK, PROBE_HV = 64, 1, 2


def _backend_contract(ctx: RankContext, case: Case) -> Iterator[Sample]:
    """The backend's check for the probe, then whether the backend keeps what the check said."""
    import torch

    from gdn import GDNShape, get_backend

    p = case.params
    name, d, packed = p["backend"], int(p["head_dim"]), p.get("packed")
    dtype = getattr(torch, p["dtype"])
    n = len(packed) if packed else None
    shape = GDNShape(1, PROBE_T, PROBE_HQK, PROBE_HV, d, d, n)
    try:
        reason = get_backend(name).unsupported(shape, dtype, ctx.device)
    except Exception as exc:  # a check that crashes says nothing: the contract is broken
        broken: str | None = f"its capability check raised {type(exc).__name__}: {exc}"
        reason = None
    else:
        broken = _keeps_refusal(ctx, p, reason) if reason is not None else _keeps_claim(ctx, p)
    print(f"{case.name}: " + (f"refused: {reason}" if reason is not None else "accepted")
          + (f"; CONTRACT BROKEN: {broken}" if broken else "; contract kept"), file=sys.stderr)  # fmt: skip
    yield Sample(case.name, "backend_supported", 0.0 if reason is not None else 1.0, rank=ctx.rank)
    yield Sample(case.name, "backend_contract", 0.0 if broken else 1.0, rank=ctx.rank)


def _probe(ctx: RankContext, p: dict[str, Any]) -> dict[str, Any]:
    """Small leaves in the probe's dtype (g in fp32, the states in fp32, fp64 for fp64)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    dt, d, packed = getattr(torch, p["dtype"]), int(p["head_dim"]), p.get("packed")
    sdt = torch.float64 if dt == torch.float64 else torch.float32
    n = len(packed) if packed else 1

    def rnd(*shape: int, dtype: Any = dt) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    T, hq, hv = PROBE_T, PROBE_HQK, PROBE_HV
    x = {
        "q": rnd(1, T, hq, d), "k": F.normalize(rnd(1, T, hq, d, dtype=sdt), dim=-1).to(dt),
        "v": rnd(1, T, hv, d), "g": F.logsigmoid(rnd(1, T, hv, dtype=sdt) + 2).float(),
        "beta": torch.sigmoid(rnd(1, T, hv, dtype=sdt)).to(dt), "h0": 0.1 * rnd(n, hv, d, d, dtype=sdt),
    }  # fmt: skip
    x = {k: t.to(ctx.device).requires_grad_(True) for k, t in x.items()}
    x["cu"] = torch.tensor([0, *torch.tensor(packed).cumsum(0).tolist()], dtype=torch.int32,
                           device=ctx.device) if packed else None  # fmt: skip
    return x


def _call_backend(p: dict[str, Any], x: dict[str, Any]) -> tuple[Any, Any]:
    from gdn import gated_delta_rule

    return gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                            output_final_state=True, cu_seqlens=x["cu"], backend=p["backend"])  # fmt: skip


def _keeps_claim(ctx: RankContext, p: dict[str, Any]) -> str | None:
    """None when the accepted request runs as the protocol promises, else what went wrong."""
    import torch

    x = _probe(ctx, p)
    try:
        o, ht = _call_backend(p, x)
        if tuple(o.shape) != tuple(x["v"].shape) or o.dtype != x["v"].dtype:
            return f"output {tuple(o.shape)} {o.dtype}, expected {tuple(x['v'].shape)} {x['v'].dtype}"
        if ht is None or tuple(ht.shape) != tuple(x["h0"].shape):
            return f"final state {None if ht is None else tuple(ht.shape)}, expected {tuple(x['h0'].shape)}"
        if not (torch.isfinite(o).all() and torch.isfinite(ht).all()):
            return "non-finite output or final state"
        (o.float().sum() + ht.float().sum()).backward()
    except Exception as exc:
        return f"the accepted request raised {type(exc).__name__}: {str(exc)[:500]}"
    missing = [k for k in ("q", "k", "v", "g", "beta", "h0")
               if x[k].grad is None or not torch.isfinite(x[k].grad).all()]  # fmt: skip
    return f"no finite gradient for {', '.join(missing)}" if missing else None


def _keeps_refusal(ctx: RankContext, p: dict[str, Any], reason: str) -> str | None:
    """None when the refused request raises UnsupportedGDNRequest with the check's reason."""
    from gdn import UnsupportedGDNRequest

    try:
        _call_backend(p, _probe(ctx, p))
    except UnsupportedGDNRequest as exc:
        return None if reason in str(exc) else f"refused for another reason: {exc} (its check said: {reason})"
    except Exception as exc:
        return f"crashed with {type(exc).__name__}: {str(exc)[:500]} instead of refusing: {reason}"
    return f"ran a request its check refuses ({reason}): a silent fall-back"


def _all_gather_triton(ctx: RankContext, q: Any, k: Any, v: Any, g: Any, beta: Any) -> None:
    """CP all_gather with backend='triton' through the real entry, on a 1-rank group if needed."""
    import torch.distributed as dist

    from gdn.cp import CPConfig, all_gather_gated_delta_rule

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
    import gdn

    return Path(gdn.__file__).resolve().parent.parent


def _fresh_python(code: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_source_root()), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, env=env, check=False,
    )  # fmt: skip
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

SUITE = CapabilitySuite()
