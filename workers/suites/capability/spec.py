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
snapshot, when there is one). The checks themselves: `workers.suites.capability.run`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, ClassVar

from workers.suite import (
    CPU_GATE_PRESETS,
    Case,
    DType,
    Metric,
    Positive,
    Suite,
    SuiteParams,
    check_backend_names,
)
from workers.suites.shared.spec import HEAD_DIM, REPORT_SEQ_LENS, V_HEADS

ERROR = "UnsupportedGDNRequest"
# The contract probe's shape: T, q/k heads, v heads, and its packed batch (a one-token sequence,
# then one a token short of a chunk)
PROBE_T, PROBE_HQK, PROBE_HV = 64, 1, 2
PACKED_PROBE = (1, 63)


class CapabilityParams(SuiteParams):
    batch: Positive = 1
    seq_lens: tuple[Positive, ...] = REPORT_SEQ_LENS
    qk_heads: tuple[Positive, ...] = (16, 32)
    v_heads: Positive = V_HEADS
    head_dim: Positive = HEAD_DIM
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
    run_module = "workers.suites.capability.run"
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
    )

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, CapabilityParams)
        out = [
            Case(self.name, f"triton_available_T{t}_hqk{h}",
                 {"check": "triton_available", "shape": [params.batch, t, h, params.v_heads,
                                                         params.head_dim, params.head_dim]})
            for t in params.seq_lens for h in params.qk_heads
        ]
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
        ]


SUITE = CapabilitySuite()
