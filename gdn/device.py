"""The one place that knows the accelerator families: CUDA, Ascend NPU (torch_npu) and CPU.

Everything else asks this module for the device, synchronisation, memory statistics, timers and
the distributed backend, so a new device family is added here and nowhere else.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch

DeviceKind = Literal["cuda", "npu", "cpu"]
DEVICE_KINDS: tuple[DeviceKind, ...] = ("cuda", "npu", "cpu")

_DIST_BACKEND: dict[str, str] = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}
_VISIBLE_DEVICES_ENV: dict[str, str | None] = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "cpu": None,
}


def _check_kind(kind: str) -> DeviceKind:
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {kind!r}; expected one of {', '.join(DEVICE_KINDS)}")
    return kind  # type: ignore[return-value]


def _npu_module() -> Any | None:
    """torch_npu registers `torch.npu` on import; it is optional and absent on most machines."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    importlib.import_module("torch_npu")
    return getattr(torch, "npu", None)


def _accelerator(kind: DeviceKind) -> Any | None:
    if kind == "cuda":
        return torch.cuda
    if kind == "npu":
        return _npu_module()
    return None


def is_available(kind: str) -> bool:
    kind = _check_kind(kind)
    if kind == "cpu":
        return True
    module = _accelerator(kind)
    return bool(module is not None and module.is_available())


def device_count(kind: str) -> int:
    kind = _check_kind(kind)
    if kind == "cpu":
        return 1
    return module.device_count() if (module := _accelerator(kind)) is not None and is_available(kind) else 0


def default_kind() -> DeviceKind:
    """The best device on this machine: CUDA, then NPU, then CPU."""
    for kind in ("cuda", "npu"):
        if is_available(kind):
            return kind  # type: ignore[return-value]
    return "cpu"


def get_device(kind: str, index: int = 0) -> torch.device:
    """The torch device for `kind`; raises when the family is not usable here."""
    kind = _check_kind(kind)
    if kind == "cpu":
        return torch.device("cpu")
    if not is_available(kind):
        raise RuntimeError(f"device kind {kind!r} requested but no {kind} device is available here")
    count = device_count(kind)
    if not 0 <= index < count:
        raise ValueError(f"{kind} device index {index} out of range; this machine has {count}")
    device = torch.device(kind, index)
    _accelerator(kind).set_device(device)  # type: ignore[union-attr]
    return device


def kind_of(device: torch.device | str) -> DeviceKind:
    return _check_kind(torch.device(device).type)


def synchronize(device: torch.device | str) -> None:
    module = _accelerator(kind_of(device))
    if module is not None:
        module.synchronize(torch.device(device))


def distributed_backend(kind: str) -> str:
    """torch.distributed backend for the family: nccl, hccl or gloo."""
    return _DIST_BACKEND[_check_kind(kind)]


def visible_devices_env(kind: str) -> str | None:
    """The environment variable that restricts a process to some devices of the family."""
    return _VISIBLE_DEVICES_ENV[_check_kind(kind)]


@dataclass(frozen=True)
class MemoryStats:
    """Bytes. `tracked` is False where the device keeps no allocator statistics (CPU)."""

    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    tracked: bool


def memory_stats(device: torch.device | str) -> MemoryStats:
    device = torch.device(device)
    module = _accelerator(kind_of(device))
    if module is None:
        return MemoryStats(0, 0, 0, 0, tracked=False)
    return MemoryStats(
        allocated=int(module.memory_allocated(device)),
        reserved=int(module.memory_reserved(device)),
        peak_allocated=int(module.max_memory_allocated(device)),
        peak_reserved=int(module.max_memory_reserved(device)),
        tracked=True,
    )


def reset_peak_memory(device: torch.device | str) -> None:
    device = torch.device(device)
    module = _accelerator(kind_of(device))
    if module is not None:
        module.reset_peak_memory_stats(device)


def empty_cache(device: torch.device | str) -> None:
    module = _accelerator(kind_of(torch.device(device)))
    if module is not None:
        module.empty_cache()


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    for kind in ("cuda", "npu"):
        if is_available(kind):
            _accelerator(kind).manual_seed_all(seed)  # type: ignore[union-attr]


def autocast_off(device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
    """No autocast inside, for code whose precision is its contract (the eager GDN core computes
    in fp32, the CP chain multiplies fp32 states): under bf16 autocast `@` on fp32 tensors runs
    in bf16."""
    return torch.autocast(device_type=torch.device(device).type, enabled=False)


def set_deterministic(kind: str, on: bool = True) -> None:
    """Deterministic kernels, fixed reduction orders and no TF32 (the report's determinism check).

    The cuBLAS workspace variable is read when cuBLAS starts, so rank processes get these
    variables from their launch environment (workers.runtime.rank_environment); setting them here
    is the fallback for a process that has not touched the device yet.
    """
    kind = _check_kind(kind)
    if on and kind == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        os.environ.setdefault("NCCL_ALGO", "Ring")
    if on and kind == "npu":
        os.environ.setdefault("HCCL_DETERMINISTIC", "true")
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    if on:
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def profiler_activities(kind: str) -> list[Any]:
    """Profiler activities that see the host and the device's work: torch.profiler's CPU (+ CUDA)
    on CPU/CUDA, torch_npu.profiler's CPU + NPU on Ascend (torch.profiler sees no NPU work)."""
    kind = _check_kind(kind)
    if kind == "npu":
        npu_profiler = _npu_profiler()
        return [npu_profiler.ProfilerActivity.CPU, npu_profiler.ProfilerActivity.NPU]
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if kind == "cuda":
        activities.append(ProfilerActivity.CUDA)
    return activities


def _npu_profiler() -> Any:
    if _npu_module() is None:
        raise RuntimeError("an NPU trace needs torch_npu (its profiler), which is not installed here")
    return importlib.import_module("torch_npu.profiler")


class DeviceProfiler:
    """One trace of the host and the device: torch.profiler, or torch_npu.profiler on Ascend.

    `with DeviceProfiler(kind) as p: ...` then `p.export(path)` writes a Chrome trace, gzipped
    when `path` ends in .gz (torch_npu writes plain JSON, so the NPU trace is compressed here).
    """

    def __init__(self, kind: str, *, record_shapes: bool = False, with_stack: bool = False) -> None:
        self.kind = _check_kind(kind)
        module = _npu_profiler() if self.kind == "npu" else importlib.import_module("torch.profiler")
        self._prof = module.profile(
            activities=profiler_activities(self.kind), record_shapes=record_shapes, with_stack=with_stack
        )

    def __enter__(self) -> DeviceProfiler:
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._prof.__exit__(*exc)

    def export(self, path: str | os.PathLike[str]) -> None:
        path = os.fspath(path)
        if self.kind != "npu" or not path.endswith(".gz"):
            self._prof.export_chrome_trace(path)
            return
        import gzip
        import shutil

        plain = path[: -len(".gz")]
        self._prof.export_chrome_trace(plain)
        with open(plain, "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(plain)


# HCCL's limits (CANN environment-variable reference): HCCL_EXEC_TIMEOUT in [68, 17340] s on the
# older chips' scale (newer CANN accepts more; this range is valid everywhere),
# HCCL_CONNECT_TIMEOUT in [120, 7200] s.
HCCL_EXEC_TIMEOUT_RANGE = (68, 17340)
HCCL_CONNECT_TIMEOUT_RANGE = (120, 7200)


def collective_env(kind: str, timeout_s: float) -> dict[str, str]:
    """Variables that make the family's collectives end within `timeout_s` (the job's process-group
    timeout, derived from its deadline), set in the rank before its process group starts.

    Ascend: HCCL_BLOCKING_WAIT / TORCH_HCCL_BLOCKING_WAIT=1 (an untimed `wait()` then gives up at
    the process-group timeout instead of leaving it to the watchdog), HCCL_EXEC_TIMEOUT (the
    device side's wait for its peers; default 1836 s) and HCCL_CONNECT_TIMEOUT (link set-up) from
    the same limit, clamped to HCCL's ranges. Nothing for CUDA and CPU (NCCL's and gloo's waits
    honour the process-group timeout already).
    """
    if _check_kind(kind) != "npu":
        return {}
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")

    def clamp(lo_hi: tuple[int, int]) -> str:
        return str(max(lo_hi[0], min(lo_hi[1], int(timeout_s))))

    return {
        "HCCL_BLOCKING_WAIT": "1",  # torch_npu up to 2.x
        "TORCH_HCCL_BLOCKING_WAIT": "1",  # the newer name
        "HCCL_EXEC_TIMEOUT": clamp(HCCL_EXEC_TIMEOUT_RANGE),
        "HCCL_CONNECT_TIMEOUT": clamp(HCCL_CONNECT_TIMEOUT_RANGE),
    }


class DeviceTimer:
    """Elapsed milliseconds of device work between `start()` and `stop()`.

    Uses device events on accelerators (no host synchronisation inside the timed region) and a
    synchronised host clock on CPU.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._module = _accelerator(kind_of(self.device))
        self._start: Any = None
        self._end: Any = None

    def start(self) -> None:
        if self._module is None:
            self._start = time.perf_counter()
        else:
            self._start = self._module.Event(enable_timing=True)
            self._end = self._module.Event(enable_timing=True)
            self._start.record()

    def stop(self) -> None:
        if self._module is None:
            self._end = time.perf_counter()
        else:
            self._end.record()

    def elapsed_ms(self) -> float:
        if self._start is None or self._end is None:
            raise RuntimeError("DeviceTimer.elapsed_ms() called before start() and stop()")
        if self._module is None:
            return (self._end - self._start) * 1e3
        self._end.synchronize()
        return float(self._start.elapsed_time(self._end))


def device_info(device: torch.device | str) -> dict[str, str | int | None]:
    """Hardware and software facts stored with every job."""
    device = torch.device(device)
    kind = kind_of(device)
    info: dict[str, str | int | None] = {
        "device_kind": kind,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "triton": None,
        "device_name": "cpu",
        "device_count": device_count(kind),
        "driver": None,
    }
    if importlib.util.find_spec("triton") is not None:
        try:
            from importlib.metadata import version

            info["triton"] = version("triton")
        except Exception:  # a vendored triton without metadata
            info["triton"] = "unknown"
    if kind == "cuda" and is_available("cuda"):
        info["device_name"] = torch.cuda.get_device_name(device)
        try:
            import ctypes

            lib = ctypes.CDLL("libcuda.so.1")
            ver = ctypes.c_int()
            lib.cuDriverGetVersion(ctypes.byref(ver))
            info["driver"] = f"cuda {ver.value // 1000}.{(ver.value % 1000) // 10}"
        except OSError:
            info["driver"] = None
    elif kind == "npu" and is_available("npu"):
        info["device_name"] = _npu_module().get_device_name(device)  # type: ignore[union-attr]
    else:
        info["device_name"] = os.uname().machine
    if kind == "npu":
        info.update(npu_versions())
    return info


def _distribution_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def npu_versions() -> dict[str, str | None]:
    """The Ascend software an NPU job ran on (None where absent): CANN as torch_npu reads it
    from the toolkit (`get_cann_version`, CANN 8.1.RC1 and later), torch_npu, and
    triton-ascend, which installs as `triton` and is told apart only by its distribution."""
    cann = None
    if _npu_module() is not None:
        try:
            cann = importlib.import_module("torch_npu.npu.utils").get_cann_version(module="CANN") or None
        except (ImportError, AttributeError, RuntimeError):
            cann = None
    return {"cann": cann, "torch_npu": _distribution_version("torch_npu"),
            "triton_ascend": _distribution_version("triton-ascend")}
