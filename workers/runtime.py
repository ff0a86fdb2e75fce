"""The per-rank entry: one process per rank, started by an executor as `python -m workers.runtime`.

Both executors (local processes and Ray actors) start ranks the same way, so a rank behaves the
same everywhere. The rank reads its job from the environment, reports everything through a
line-oriented JSON *channel* (a pipe the executor reads), and never touches the database.

Environment contract (set by the executor):
    GDNVAL_RANK_PAYLOAD  JSON: suite, suite_module, preset, params, device, world_size, commit,
                         deterministic, pg_timeout_s, seed, cases (None: all; else only those),
                         skip_cases (finished by an earlier run of the job: not run again)
    GDNVAL_CHANNEL_FD    file descriptor the channel messages are written to
    GDNVAL_RANK_TMP      the rank's artifacts folder (the executor removes it when the rank exits)
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT   torch `env://` rendezvous

Channel messages (one JSON object per line, `"t"` says which; every message has `"rank"`):
    info        {"info": {...}}                    hardware/software facts of this rank, the suite's
                                                   version and metric definitions (of this code)
    cases       {"total": n, "names": [...]}       the case list, before the first case
    case_start  {"case": name, "index": i}
    samples     {"samples": [[case, metric, value, rank, idx], ...]}   batched
    case_end    {"case": name, "status": CaseStatus, "error": str | None}
    artifact    {"name": ..., "media_type": ..., "data": base64}
    log         {"line": ...}                      (executors also turn the rank's stdout/stderr into these)
    fatal       {"error": str, "failed_rank": int, "cause": "raised" | "peer"}
    done        {}

How a case ran on one rank: `expected_error` set -> `expected_error` when an exception whose
class (or a base class) has that name is raised, `failed` when nothing is raised, `error` for
any other exception. Otherwise `error` when the case raises, else `passed` (it ran). Samples of
undeclared metrics make the case an `error`; the runtime stamps each sample with this rank. The
executor's monitor combines ranks and judges the bounds on every rank's samples together
(`workers.verdict`: worst rank, statistics, bound), so a case's status has one rule everywhere.

Environment handled here (`rank_environment`, applied by the executors when they start a rank):
the Python environment's own libstdc++ first on LD_LIBRARY_PATH (Triton), deterministic flags on
request, NVLink multicast off on CUDA ranks (`NVLS_OFF_ENV`, whatever the caller's environment
says), TRITON_INTERPRET=1 and a share of the cores (OMP_NUM_THREADS) on CPU ranks.

A case that raises `NotImplementedError` (a backend that does not take the case's input) is
`skipped`, with its message, not an error.

In a distributed job a case that raised on some ranks leaves the case's process group out of
step (messages sent that were never received), so after every case the ranks exchange, over a
separate gloo control group, whether they raised; when any did, every rank moves to a fresh
group for the next case, and the later cases run as if the failed one had not happened. A rank
that cannot take part in the exchange (dead, or stuck in the case) is fatal for the job.
"""

from __future__ import annotations

import base64
import ctypes
import dataclasses
import inspect
import json
import mimetypes
import os
import platform
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.context import RankContext
from workers.device_presets import device_refusal
from workers.provenance import backend_provenance, source_content_hash
from workers.suite import Case, CaseFailed, CaseStatus, Sample, Suite, UnknownSuiteInput, select_cases

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["PROTOCOL_VERSION", "RankContext", "rank_environment", "traceback_tail"]

PROTOCOL_VERSION = 1
PAYLOAD_ENV = "GDNVAL_RANK_PAYLOAD"
CHANNEL_FD_ENV = "GDNVAL_CHANNEL_FD"
RANK_TMP_ENV = "GDNVAL_RANK_TMP"  # the rank's scratch folder, made and removed by the executor
SAMPLE_BATCH = 256  # samples per channel message
SAMPLE_FLUSH_S = 0.5  # longest a sample waits in the buffer
TRACEBACK_TAIL_LINES = 25
DEFAULT_PG_TIMEOUT_S = 1800.0
# NVLink multicast (NVLS) off in NCCL, PyTorch's symmetric memory and NVSHMEM. On shared several-GPU
# hosts a program that uses multicast can put every GPU of the host out of service, so CUDA ranks
# always get these values: set, not defaulted, so an inherited environment cannot turn it on.
NVLS_OFF_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


# --------------------------------------------------------------------------- environment


def env_libstdcxx_dir(prefixes: list[str] | None = None) -> Path | None:
    """The Python environment's lib dir holding its own libstdc++ (conda-style), if any.

    Triton's compiled launchers need GLIBCXX_3.4.29; an older system libstdc++ that wins the
    loader search breaks the capability check (workers/suites/capability/run.py), so ranks put this first.
    """
    candidates = prefixes if prefixes is not None else [sys.prefix, sys.exec_prefix, sys.base_prefix]
    for prefix in dict.fromkeys(candidates):
        if os.path.realpath(prefix) in ("/", "/usr", "/usr/local"):
            continue  # the system's own libstdc++ is what we must not prefer
        lib = Path(prefix) / "lib"
        if (lib / "libstdc++.so.6").exists():
            return lib
    return None


def rank_environment(
    device: str,
    *,
    deterministic: bool = False,
    world_size: int = 1,
    base_env: Mapping[str, str] | None = None,
    prefixes: list[str] | None = None,
    cpu_count: int | None = None,
) -> dict[str, str]:
    """The variables a rank process needs set before it starts (the loader reads some at start).

    Returns only the variables to set or override; executors merge them into the child's env.
    """
    base = dict(os.environ if base_env is None else base_env)
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    lib = env_libstdcxx_dir(prefixes)
    if lib is not None:
        parts = [p for p in base.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != str(lib)]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(lib), *parts])
    if deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # required by use_deterministic_algorithms on CUDA
        env["HCCL_DETERMINISTIC"] = "true"  # deterministic reductions on Ascend
        env["NCCL_ALGO"] = "Ring"  # one reduction order, not chosen per message size
        env["PYTHONHASHSEED"] = "0"
    if device == "cuda":
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"  # a failed collective aborts instead of hanging
        env.update(NVLS_OFF_ENV)
        if "CUBLAS_WORKSPACE_CONFIG" not in base:
            # cuBLAS reads this once, at start: a suite that turns deterministic mode on for one
            # case (network's determinism pair) needs it from the beginning, not from that case on.
            env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if device == "cpu" and "TRITON_INTERPRET" not in base:
        env["TRITON_INTERPRET"] = "1"  # compiled Triton cannot run on a CPU rank; its interpreter can
    if device == "cpu" and "OMP_NUM_THREADS" not in base:
        cores = cpu_count or os.cpu_count() or 1
        # ranks share the cores but one, which stays with the service and the rank monitor: a
        # rank thread that has to wait for a core stalls every op of its rank at the next join
        env["OMP_NUM_THREADS"] = str(max(1, (cores - 1) // max(1, world_size)))
    return env


def preload_env_libstdcxx(prefixes: list[str] | None = None) -> Path | None:
    """Load the environment's libstdc++ into this process before torch/triton load the system one."""
    lib = env_libstdcxx_dir(prefixes)
    if lib is None:
        return None
    try:
        ctypes.CDLL(str(lib / "libstdc++.so.6"), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    return lib


# --------------------------------------------------------------------------- channel


class Channel:
    """Writes one JSON message per line to the executor; thread-safe."""

    def __init__(self, stream: Any, rank: int) -> None:
        self._stream = stream
        self._rank = rank
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, rank: int) -> Channel:
        fd = os.environ.get(CHANNEL_FD_ENV)
        if fd is None:
            raise RuntimeError(f"{CHANNEL_FD_ENV} is not set: the rank runtime is started by an executor")
        return cls(os.fdopen(int(fd), "w", buffering=1, encoding="utf-8"), rank)

    def send(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"t": kind, "v": PROTOCOL_VERSION, "rank": self._rank, **fields}, default=str)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


class SampleBuffer:
    """Batches samples so a 10^5-sample case costs a few hundred messages, not 10^5.

    A sample waits at most about `flush_s` (2x at worst) even when no other follows soon: a
    background thread sends what waits, so a case that yields a few samples per slow step (a
    trajectory) has them at the executor before a deadline or a kill ends the rank mid-case."""

    def __init__(self, channel: Channel, flush_s: float = SAMPLE_FLUSH_S) -> None:
        self._channel = channel
        self._flush_s = flush_s
        self._rows: list[list[Any]] = []
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def add(self, s: Sample) -> None:
        with self._lock:
            self._rows.append([s.case, s.metric, float(s.value), s.rank, s.idx])
            if len(self._rows) >= SAMPLE_BATCH or time.monotonic() - self._last_flush > self._flush_s:
                self._flush_locked()
        if self._ticker is None and not self._stop.is_set():
            self._ticker = threading.Thread(target=self._tick, name="gdnval-sample-flush", daemon=True)
            self._ticker.start()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        """Send what waits and stop the background thread."""
        self._stop.set()
        self.flush()
        if self._ticker is not None:
            self._ticker.join(timeout=5)

    def _flush_locked(self) -> None:  # under self._lock, so messages keep the samples' order
        if self._rows:
            self._channel.send("samples", samples=self._rows)
            self._rows = []
        self._last_flush = time.monotonic()

    def _tick(self) -> None:
        while not self._stop.wait(self._flush_s):
            with self._lock:
                if self._rows and time.monotonic() - self._last_flush >= self._flush_s:
                    self._flush_locked()


def traceback_tail(exc: BaseException, lines: int = TRACEBACK_TAIL_LINES) -> str:
    text = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return "\n".join(text[-lines:])


def _error_matches(exc: BaseException, expected: str) -> bool:
    return any(cls.__name__ == expected for cls in type(exc).__mro__)


# --------------------------------------------------------------------------- running cases


@dataclasses.dataclass
class CaseOutcome:
    status: CaseStatus
    error: str | None
    raised: bool


def run_case(suite: Suite, ctx: RankContext, case: Case, buffer: SampleBuffer) -> CaseOutcome:
    """Run one case on this rank and stream its samples. How the case ran is decided here
    (raised, expected error); its bounds are judged where every rank's samples meet, by the
    executor's job monitor (`workers.verdict`), so one rule covers all ranks."""
    try:
        for sample in suite.run(ctx, case):
            suite.metric(sample.metric)  # KeyError for an undeclared metric: a suite bug
            if sample.case != case.name:
                raise ValueError(f"case {case.name!r} yielded a sample for case {sample.case!r}")
            if sample.rank != ctx.rank:  # the runtime stamps the rank: suites may leave the default
                sample = dataclasses.replace(sample, rank=ctx.rank)
            buffer.add(sample)
    except Exception as exc:
        buffer.flush()
        if case.expected_error and _error_matches(exc, case.expected_error):
            return CaseOutcome("expected_error", f"{type(exc).__name__}: {exc}", raised=True)
        if isinstance(exc, CaseFailed):  # the code under test failed, in the suite's words
            return CaseOutcome("failed", str(exc), raised=True)
        if isinstance(exc, NotImplementedError):  # e.g. a backend that does not take this input
            return CaseOutcome("skipped", f"not applicable: NotImplementedError: {exc}", raised=True)
        return CaseOutcome("error", traceback_tail(exc), raised=True)
    buffer.flush()
    if case.expected_error:
        return CaseOutcome(
            "failed", f"expected {case.expected_error} to be raised, but the case finished", raised=False
        )
    return CaseOutcome("passed", None, raised=False)


class RankDesync(RuntimeError):
    """A rank could not agree on a case's end with the others (one died or is stuck in the case)."""

    def __init__(self, message: str, failed_rank: int, cause: str) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank
        self.cause = cause


def _exchange_case_outcome(
    ctx: RankContext, ctrl: dist.ProcessGroup, case: Case, outcome: CaseOutcome
) -> bool:
    """Whether any rank raised in the case, agreed by every rank over the control group; the job
    stops when the exchange itself fails."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * ctx.world_size
    try:
        dist.all_gather_object(gathered, outcome.raised, group=ctrl)
    except Exception as exc:
        raise RankDesync(
            f"rank {ctx.rank} could not exchange the end of case {case.name!r} with the other ranks "
            f"(a rank died or is still in the case): {exc}",
            failed_rank=ctx.rank,
            cause="peer",
        ) from exc
    return any(gathered)


def _send_artifacts(channel: Channel, directory: Path, rank: int) -> None:
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        channel.send(
            "artifact",
            name=f"rank{rank}/{rel}",
            media_type=media_type,
            data=base64.b64encode(path.read_bytes()).decode(),
        )
        path.unlink()


def load_suite(name: str, module: str | None) -> Suite:
    """The suite by the module the executor named (test suites), else from the registry."""
    if module:
        import importlib

        suite = importlib.import_module(module).SUITE
        if suite.name != name:
            raise RuntimeError(f"module {module} defines suite {suite.name!r}, expected {name!r}")
        return suite
    from workers.registry import get_suite

    return get_suite(name)


def check_suite_fits(suite: Suite, device: str, world_size: int) -> None:
    """The suite's declared devices and minimum world size, checked before any case runs."""
    if device not in suite.devices:
        raise UnknownSuiteInput(
            f"suite {suite.name!r} does not run on {device!r}; it runs on {', '.join(suite.devices)}"
        )
    if world_size < suite.min_world_size:
        raise UnknownSuiteInput(
            f"suite {suite.name!r} needs world_size >= {suite.min_world_size}, got {world_size}"
        )


def rank_info(device: Any, kind: str, commit: str | None) -> dict[str, Any]:
    import torch

    from gdn import device as devices
    from workers.provenance import installed_version, source_commit, source_modified

    info: dict[str, Any] = dict(devices.device_info(device))
    visible = devices.visible_devices_env(kind)
    info.update(
        {
            "gdnval": installed_version(),
            "commit": commit or source_commit(),
            "source_modified": False if commit else source_modified(),  # a snapshot is exact
            "python": platform.python_version(),
            "platform": platform.platform(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "source_root": str(Path(__file__).resolve().parent.parent),  # the snapshot, for a commit job
            "visible_devices": os.environ.get(visible) if visible else None,
            "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "torch_threads": torch.get_num_threads(),
        }
    )
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except ImportError:
        info["numpy"] = None
    return info


def run_rank(payload: Mapping[str, Any], rank: int, world_size: int, channel: Channel) -> None:
    """Set up the device and process group, then run every case of the job on this rank."""
    suite = load_suite(payload["suite"], payload.get("suite_module"))
    kind = payload.get("device", "cpu")
    check_suite_fits(suite, kind, world_size)
    params = suite.resolve_params(payload.get("preset", "quick"), payload.get("params") or {}, device=kind)
    cases = select_cases(suite.cases(params), payload.get("cases"))
    finished = set(payload.get("skip_cases") or ())  # an earlier run of the job finished these
    cases = [c for c in cases if c.name not in finished]
    deterministic = bool(payload.get("deterministic", False))

    try:
        import torch
    except ModuleNotFoundError as exc:  # a service-only install: the ranks need the torch extra
        raise RuntimeError(f"{sys.executable} has no torch ({exc}); a rank runs gdnval's suites with its "
                           "`torch` extra installed (pip install 'gdnval[torch]')") from exc
    import torch.distributed as dist

    from gdn import device as devices

    if deterministic:
        devices.set_deterministic(kind)
    if kind == "cpu" and "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    index = int(os.environ.get("LOCAL_RANK", "0"))
    visible = devices.visible_devices_env(kind)
    if visible and os.environ.get(visible):  # the executor gave this rank exactly its device(s)
        index = 0
    device = devices.get_device(kind, index)
    refusal = device_refusal(suite.backends(params), device)  # never eager in a backend's place
    if refusal is not None:
        raise UnknownSuiteInput(refusal)
    seed = int(payload.get("seed", 0))
    devices.manual_seed_all(seed)

    pg_timeout = timedelta(seconds=float(payload.get("pg_timeout_s") or DEFAULT_PG_TIMEOUT_S))
    group = ctrl = None
    if world_size > 1:
        os.environ.update(devices.collective_env(kind, pg_timeout.total_seconds()))  # HCCL's timeouts
        dist.init_process_group(
            backend=devices.distributed_backend(kind),
            init_method="env://",
            rank=rank,
            world_size=world_size,
            timeout=pg_timeout,
        )
        group = dist.group.WORLD
        ctrl = dist.new_group(backend="gloo", timeout=pg_timeout)  # the case-end exchange, CPU only

    info = rank_info(device, kind, payload.get("commit"))
    # the bytes of the code under test: the runtime packages and the suite's own module
    info["code_hash"] = source_content_hash(extra=(Path(inspect.getfile(type(suite))).resolve(),))
    # a built-in backend is our code: the job's commit, not that of the tree the snapshot sits in
    info["backends"] = [backend_provenance(b, info["commit"]) for b in suite.backends(params)]
    # this code's metric definitions judge this job (and are what its summaries are stored with)
    metrics = [m.to_dict() for m in suite.metrics]
    channel.send("info", info={**info, "suite_version": suite.version, "metrics": metrics})
    channel.send("cases", total=len(cases), names=[c.name for c in cases])
    scratch = os.environ.get(RANK_TMP_ENV)
    artifacts = Path(scratch) if scratch else Path(tempfile.mkdtemp(prefix=f"gdnval-rank{rank}-"))
    ctx = RankContext(
        rank=rank,
        world_size=world_size,
        device=device,
        device_kind=kind,
        group=group,
        deterministic=deterministic,
        seed=seed,
        artifacts_dir=artifacts,
        extras={"preset": payload.get("preset"), "params": params.model_dump()},
    )
    buffer = SampleBuffer(channel)
    try:
        for i, case in enumerate(cases):
            channel.send("case_start", case=case.name, index=i)
            misfit = suite.why_not_here(case, world_size)
            if misfit is not None:  # the same answer on every rank: nothing runs, nothing desyncs
                why = f"not applicable at world size {world_size}: {misfit}"
                outcome = CaseOutcome("skipped", why, raised=False)
            else:
                outcome = run_case(suite, ctx, case, buffer)
            _send_artifacts(channel, artifacts, rank)
            channel.send("case_end", case=case.name, status=outcome.status, error=outcome.error)
            if ctrl is not None and _exchange_case_outcome(ctx, ctrl, case, outcome):
                # a rank left the case early: the case group may hold unmatched messages, so the
                # next case gets a fresh group and runs as if this one had not happened
                ctx.group = dist.new_group(backend=devices.distributed_backend(kind), timeout=pg_timeout)
    finally:
        buffer.close()
        shutil.rmtree(artifacts, ignore_errors=True)
        if world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _watch_parent(interval_s: float = 1.0) -> None:
    """Exit when the executor (our parent) is gone, so no rank outlives its job."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=watch, name="gdnval-parent-watch", daemon=True).start()


def main() -> int:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    channel = Channel.from_env(rank)
    _watch_parent()
    try:
        payload = json.loads(os.environ[PAYLOAD_ENV])
        preload_env_libstdcxx()
        run_rank(payload, rank, world_size, channel)
    except RankDesync as exc:
        channel.send("fatal", error=str(exc), failed_rank=exc.failed_rank, cause=exc.cause)
        return 1
    except BaseException as exc:  # anything else that escapes the case loop fails the job
        channel.send("fatal", error=traceback_tail(exc), failed_rank=rank, cause="raised")
        return 1
    channel.send("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
