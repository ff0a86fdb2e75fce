"""Every Triton kernel launch, compiled ahead of time for Hopper (sm_90), fits its shared memory.

No GPU is needed: the kernels of every stage module of `kernels.gdn` are swapped for recorders, the
real wiring (forward + backward of `gated_delta_rule_triton` and of packed sequences, the CP state
summary, the split state passes) runs on CPU tensors of each input dtype,
and each recorded launch is specialised and compiled the way `JITFunction.run` would do it on a
device (same binder, constexprs, alignment attributes, num_warps/num_stages) but for
`GPUTarget("cuda", 90, 32)`; ptxas ships in the Triton wheel.
`metadata.shared` is the dynamic shared memory the launch asks for, the number that raised
`OutOfResources` on the H200 for fp32 inputs (bwd_dqk); it is final once the MLIR passes of the
LLVM IR stage have allocated shared memory, where the test stops each compile (before LLVM -O3).
The n of the Hopper tensor-core (wgmma) instructions comes from the TTGIR's `nvidia_mma` layouts.
The report (`python -m tests.kernels.test_kernels_compile` prints the table) compiles on through
PTX and ptxas: registers and spills come from cuobjdump and are reported, not asserted.

The margin below the limit matters: the device ran Triton 3.6, whose numbers differ from the
installed Triton's (bwd_dqk fp32, bf16 settings: 409600 B there, 376832 B with Triton 3.9).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass

import pytest
import torch

triton = pytest.importorskip("triton")

import kernels.gdn as gdn_kernels  # noqa: E402
from kernels.gdn import config as gdn_config  # noqa: E402

HOPPER_SMEM = 232448  # bytes of shared memory per block on sm_90 (H100/H200)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# fp16 has bf16's element size and launch settings (asserted below), so its shared memory equals
# bf16's; compiling it too would cost CI a minute for no new answer (`--full` compiles all three).
COMPILED_DTYPES = (torch.bfloat16, torch.float32)


def _target():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


def _ptxas_present() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return os.path.exists(get_ptxas(90).path)
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _ptxas_present(), reason="Triton without its NVIDIA backend/ptxas")


@dataclass
class Compiled:
    kernel: str
    dtype: str
    num_warps: int
    num_stages: int
    constexprs: dict
    shared: int
    mma_n: list[int]  # the distinct n of its wgmma instructions (versionMajor 3 nvidia_mma layouts)
    regs: int | None
    spill_bytes: int | None  # local-memory stack frame (spills and local arrays)


def _wgmma_n(ttgir: str) -> list[int]:
    """The distinct n of the wgmma instruction shapes of a TTGIR module's layouts."""
    found = re.findall(r"nvidia_mma<\{versionMajor = 3,[^}]*instrShape = \[\d+, (\d+), \d+\]", ttgir)
    return sorted({int(n) for n in found})


class _Recorder:
    def __init__(self, fn, sink: list) -> None:
        self.fn, self.sink = fn, sink

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.sink.append((self.fn, args, dict(kwargs)))

        return launch


def _inputs(dtype: torch.dtype, T: int, hq: int, hv: int):
    def t(*shape, dt=dtype):
        return torch.randn(*shape, dtype=dt).requires_grad_()

    return (t(1, T, hq, 128), t(1, T, hq, 128), t(1, T, hv, 128), t(1, T, hv, dt=torch.float32),
            t(1, T, hv), t(1, hv, 128, 128, dt=torch.float32))


def _drive(mod, dtype: torch.dtype, full: bool) -> None:
    """Run the real wiring: grouped heads with and without states and the CP summary at T = 65 (the
    failing H200 case), the split state passes (also with U or Vn, Wk and the local dVn formed in the walks),
    packed sequences and the fused path (one walk and two segments, the backward also in value
    slices) at T = 130. `full` (the
    `--full` report) adds Hqk = Hv and T = 8192 (T % 16 == 0 changes Triton's alignment
    specialisation); measured with Triton 3.9 they change no kernel's shared memory, and
    compiling them all cold takes ~10 min on two cores."""
    for T in (65, 8192) if full else (65,):
        for hq, hv in ((1, 2), (1, 1)) if full else ((1, 2),):
            q, k, v, g, beta, h0 = _inputs(dtype, T, hq, hv)
            o, s = mod.gated_delta_rule_triton(q, k, v, g, beta, initial_state=h0, output_final_state=True)
            (o.float().sum() + s.sum()).backward()
            o, _ = mod.gated_delta_rule_triton(q, k, v, g, beta)
            o.float().sum().backward()
            mod.state_summary(k, v, g, beta, initial_state=h0, zero_values=True)
            mod.state_summary(k, v, g, beta)
    # the sequence-parallel state passes (chosen on a GPU from the shape; forced here)
    q, k, v, g, beta, h0 = _inputs(dtype, 130, 1, 2)
    with mod.config_overrides(seq_segments=2):
        o, s = mod.gated_delta_rule_triton(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        (o.float().sum() + s.sum()).backward()
    # the walks that form U or Vn, Wk and the intra-chunk dVn in their steps (split: the summary
    # walk too)
    for walk_vn, walk_wk in (("u", False), ("t", True)):
        with mod.config_overrides(seq_segments=2, walk_vn=walk_vn, dvl_in_walk=True, walk_wk=walk_wk):
            o, s = mod.gated_delta_rule_triton(q, k, v, g, beta, initial_state=h0, output_final_state=True)
            (o.float().sum() + s.sum()).backward()
    # packed sequences (every stage through the chunk table, one walk per sequence in the state
    # passes), and a forward without autograd
    cu, h0s = torch.tensor([0, 65, 130]), torch.zeros(2, 2, 128, 128).requires_grad_()
    o, s = mod.gated_delta_rule_triton_varlen(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0s,
                                              output_final_state=True)
    (o.float().sum() + s.sum()).backward()
    with torch.no_grad():
        mod.gated_delta_rule_triton_varlen(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0s)
    # the fused path: one walk, then split into 2 segments of one-chunk groups (the maps kernels,
    # the scans), then the backward in value slices of 64 columns (the slices' running sums)
    for over in ({"seq_segments": 1}, {"seq_segments": 2}, {"seq_segments": 2, "fused_bwd_bv": 64}):
        with mod.config_overrides(fused=True, fused_group=1, **over):
            o, s = mod.gated_delta_rule_triton(q, k, v, g, beta, initial_state=h0, output_final_state=True)
            (o.float().sum() + s.sum()).backward()


def _recorded_launches(dtype: torch.dtype, full: bool) -> list:
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    sink: list = []
    names = [m.name for m in pkgutil.iter_modules(gdn_kernels.__path__)]
    mods = [importlib.import_module(f"kernels.gdn.{name}") for name in names]
    patched = [(mod, n) for mod in mods for n, f in vars(mod).items()
               if isinstance(f, JITFunction) and n.endswith("_kernel")]
    assert len(patched) >= 11, f"compilable kernels found: {patched} (is TRITON_INTERPRET set?)"
    try:
        for mod, n in patched:
            setattr(mod, n, _Recorder(getattr(mod, n), sink))
        _drive(gdn_kernels, dtype, full)
    finally:
        for mod, n in patched:
            setattr(mod, n, getattr(mod, n).fn)
    return sink


def _resources(cubin: bytes) -> tuple[int | None, int | None]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    reg, stack = re.search(r"REG:(\d+)", out), re.search(r"STACK:(\d+)", out)
    return (int(reg.group(1)) if reg else None), (int(stack.group(1)) if stack else None)


def _distinct_launches(dtype: torch.dtype, full: bool, backend) -> Iterator[tuple]:
    """(fn, signature, constexprs, attrs, options) of each distinct launch of `dtype` inputs, as
    JITFunction.run specialises it, in the order the wiring makes them."""
    from triton.runtime.jit import create_function_from_signature

    seen = set()
    for fn, args, kwargs in _recorded_launches(dtype, full):
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, spec, opts = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
        key = (fn.__name__, repr(signature), repr(constexprs), repr(attrs), repr(options))
        if key not in seen:
            seen.add(key)
            yield fn, signature, constexprs, attrs, options


class _SharedKnown(Exception):
    """Raised in the LLVM IR stage once its MLIR passes have allocated shared memory: the
    `ttg.shared` attribute they leave on the module is what `make_llir` reports as `shared`."""

    def __init__(self, metadata: dict) -> None:
        super().__init__("shared memory known")
        self.metadata = dict(metadata)


class _Lowered(Exception):
    """Raised in place of LLVM's -O3 pipeline, which starts after the MLIR passes."""


@contextmanager
def _stop_after_shared_allocation() -> Iterator[None]:
    """Compiles inside end once shared memory is known: LLVM's -O3, PTX and ptxas (about three
    quarters of a cold fp32 compile) only shape the registers and spills, which are the report's,
    not the test's. Nothing of a stopped compile is a hit of Triton's cache later (it writes a
    group's metadata last); `_compile_one` keeps the shared bytes there itself."""
    from triton.backends.nvidia import compiler as nvidia

    add, optimize = nvidia.CUDABackend.add_stages, nvidia.llvm.optimize_module

    def add_stages(self, stages, options, language):  # type: ignore[no-untyped-def]
        add(self, stages, options, language)
        make_llir = stages["llir"]

        def llir_then_stop(src, metadata):  # type: ignore[no-untyped-def]
            metadata["mma_n"] = _wgmma_n(str(src))  # the TTGIR, before the passes rewrite it
            try:
                make_llir(src, metadata)  # its pass manager rewrites `src` in place
            except _Lowered:
                metadata["shared"] = src.get_int_attr("ttg.shared")
            assert isinstance(metadata.get("shared"), int), f"no ttg.shared after the passes: {metadata}"
            raise _SharedKnown(metadata)

        stages["llir"] = llir_then_stop

    def lowered(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise _Lowered

    nvidia.CUDABackend.add_stages, nvidia.llvm.optimize_module = add_stages, lowered
    try:
        yield
    finally:
        nvidia.CUDABackend.add_stages, nvidia.llvm.optimize_module = add, optimize


SHARED_FILE = "shared-memory.json"  # a stopped compile's answer, beside Triton's own cache files


def _cache_of(src, target, options):  # -> (Triton's cache manager for this compile, its hash)
    """The cache entry `triton.compile` would use: its key, computed as it computes it."""
    import hashlib

    from triton.compiler import make_backend
    from triton.compiler.compiler import get_cache_invalidating_env_vars, get_cache_key
    from triton.runtime.cache import get_cache_manager

    backend = make_backend(target)
    opts = backend.parse_options(dict(options.__dict__, **src.parse_options()))
    key = get_cache_key(src, backend, opts, env_vars=get_cache_invalidating_env_vars())
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return get_cache_manager(digest), digest


def _compile_one(dtype: torch.dtype, launch: tuple, target, to_ptxas: bool = True) -> Compiled:
    """One launch compiled for `target`. `to_ptxas=False` stops once shared memory is known and
    keeps that number in Triton's cache (a whole compile found there is used as it is); registers
    and spills are None then."""
    from triton.compiler import ASTSource

    fn, signature, constexprs, attrs, options = launch
    src = ASTSource(fn, signature, constexprs, attrs)
    regs = stack = None
    cache, digest = (None, None) if to_ptxas else _cache_of(src, target, options)
    known = cache.get_file(SHARED_FILE) if cache is not None else None
    facts = None
    if known is not None:
        with open(known) as f:
            facts = json.load(f)
    if facts is not None and "mma_n" in facts:
        shared, mma_n = facts["shared"], facts["mma_n"]
    else:
        try:
            with ExitStack() as stop:
                if not to_ptxas:
                    stop.enter_context(_stop_after_shared_allocation())
                ck = triton.compile(src, target=target, options=options.__dict__)
            shared, (regs, stack) = ck.metadata.shared, _resources(ck.asm["cubin"])
            mma_n = _wgmma_n(ck.asm["ttgir"])
        except _SharedKnown as known_shared:
            shared, mma_n = known_shared.metadata["shared"], known_shared.metadata["mma_n"]
            assert known_shared.metadata["hash"] == digest, "the cache key differs from triton.compile's"
            cache.put(json.dumps({"shared": shared, "mma_n": mma_n}), SHARED_FILE, binary=False)
    names = {p.num: p.name for p in fn.params}
    return Compiled(
        kernel=fn.__name__, dtype=str(dtype).split(".")[-1], num_warps=options.num_warps,
        num_stages=options.num_stages, shared=shared, mma_n=mma_n, regs=regs, spill_bytes=stack,
        constexprs={names[p[0]]: v for p, v in constexprs.items() if names[p[0]].isupper()},
    )


def compile_all(dtype: torch.dtype, full: bool = False) -> Iterator[Compiled]:
    """Compile each distinct launch of `dtype` inputs for sm_90, as JITFunction.run specialises it."""
    from triton.compiler import make_backend

    target = _target()
    backend = make_backend(target)
    for launch in _distinct_launches(dtype, full, backend):
        yield _compile_one(dtype, launch, target)


# Kernels whose cold sm_90 compile takes several times the others' (the largest bodies):
# the shared queue hands them out first, so the two workers end within a short compile of each other.
SLOW_COMPILES = ("_bwd_wy_kernel", "_intra_t_kernel", "_bwd_dqk_kernel")


def work_list(dtypes: tuple[torch.dtype, ...], backend) -> list[tuple[int, torch.dtype, tuple]]:
    """Every distinct launch of `dtypes`, numbered in wiring order, slow compiles (fp32 first) ahead."""
    items = [(dt, launch) for dt in dtypes for launch in _distinct_launches(dt, False, backend)]
    numbered = [(i, dt, launch) for i, (dt, launch) in enumerate(items)]

    def cost_rank(item: tuple) -> tuple[int, int]:
        _, dt, launch = item
        return (launch[0].__name__ not in SLOW_COMPILES, dt != torch.float32)

    return sorted(numbered, key=cost_rank)


def claim(counter: str) -> int:
    """The next item of the shared queue: a number in a file, read and bumped under an exclusive lock."""
    import fcntl

    with open(counter, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        n = int(f.read() or 0)
        f.seek(0), f.truncate(), f.write(str(n + 1))
        return n


def serve_queue(dtypes: tuple[torch.dtype, ...], counter: str) -> dict[str, list[dict]]:
    """Compile the items this worker claims from the queue shared with the other workers (each
    records the same list: the wiring is deterministic); rows carry their wiring number."""
    from triton.compiler import make_backend

    target = _target()
    backend = make_backend(target)
    items = work_list(dtypes, backend)
    table: dict[str, list[dict]] = {}
    while (n := claim(counter)) < len(items):
        i, dt, launch = items[n]
        row = asdict(_compile_one(dt, launch, target, to_ptxas=False))
        table.setdefault(row["dtype"], []).append({"index": i, "of": len(items), **row})
    return table


def _row(c: Compiled) -> str:
    return (f"{c.kernel:20s} {c.dtype:8s} warps={c.num_warps} stages={c.num_stages} shared={c.shared:6d} "
            f"wgmma_n={c.mma_n} regs={c.regs} stack={c.spill_bytes} {c.constexprs}")


COMPILE_WORKERS = 2  # CI's cores; the test run itself is serial


@pytest.fixture(scope="module")
def compiled() -> dict[str, list[dict]]:
    """The table for every dtype, from child processes without TRITON_INTERPRET (under the CPU
    interpreter @triton.jit and triton.language's own jit helpers are interpreted functions,
    which cannot be compiled): each compile is one core's work, so two workers take the launches
    of both dtypes from one queue (one process per dtype left a core idle while fp32's spilling
    kernels compiled: fp32 costs twice bf16's time)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    table: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as files:
        counter = os.path.join(tmp, "next")
        with open(counter, "w") as f:
            f.write("0")
        runs = []
        for w in range(COMPILE_WORKERS):  # output to files: a full pipe would stall a child
            out, err = (files.enter_context(open(os.path.join(tmp, f"{w}{e}"), "w+")) for e in ("o", "e"))
            cmd = [sys.executable, "-m", "tests.kernels.test_kernels_compile", "--json", "--queue", counter]
            runs.append((subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=err), out, err))
        for proc, out, err in runs:
            rc = proc.wait(timeout=900)
            out.seek(0), err.seek(0)
            assert rc == 0, err.read()[-4000:]
            for dtype, rows in json.loads(out.read().strip().splitlines()[-1]).items():
                table.setdefault(dtype, []).extend(rows)
    rows = [r for dtype_rows in table.values() for r in dtype_rows]
    sizes, done = {r.pop("of") for r in rows}, sorted(r["index"] for r in rows)
    assert len(sizes) == 1 and done == list(range(sizes.pop())), f"queue items compiled: {done}"
    for dtype_rows in table.values():  # back in wiring order
        dtype_rows.sort(key=lambda r: r.pop("index"))
    return table


# The fused path's kernels (dense sequences only: no VARLEN form)
FUSED = {"_fused_fwd_kernel", "_fused_maps_kernel", "_fused_bwd_kernel", "_fused_dmaps_kernel"}


@pytest.mark.parametrize("dtype", COMPILED_DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_every_launch_fits_hopper_shared_memory(compiled: dict, dtype: torch.dtype) -> None:
    rows = [Compiled(**r) for r in compiled[str(dtype).split(".")[-1]]]
    print("\n" + "\n".join(_row(c) for c in rows))
    kernels = {c.kernel for c in rows}
    expected = {"_gate_cumsum_kernel", "_intra_t_kernel", "_intra_wu_kernel", "_state_fwd_kernel",
                "_output_kernel",
                "_dvn_local_kernel", "_state_bwd_kernel", "_bwd_dqk_kernel", "_bwd_wy_kernel",
                "_segment_fwd_summary_kernel", "_segment_scan_kernel"} | FUSED
    assert kernels == expected, f"launches recorded for {sorted(kernels)}"
    dense_only = {"_segment_fwd_summary_kernel", "_segment_scan_kernel"} | FUSED
    packed = {c.kernel for c in rows if c.constexprs.get("VARLEN")}
    assert packed == expected - dense_only, sorted(packed)
    assert all(c.shared > 0 for c in rows if c.kernel != "_gate_cumsum_kernel")
    over = [_row(c) for c in rows if c.shared > HOPPER_SMEM]
    assert not over, f"over {HOPPER_SMEM} B of shared memory on sm_90:\n" + "\n".join(over)


def test_fused_backward_runs_no_wgmma_narrower_than_its_whole_state_program(compiled: dict) -> None:
    """The fused backward at every allowed fused_bwd_bv (bf16: its products on the tensor cores)
    issues wgmma instructions no narrower than n = 32, the narrowest of the whole-state program
    (parts of FUSED_BWD_MIN_PART = 64 columns over its two warp groups); the refused 32- and
    16-column parts issued n = 16 and 8, and ended in an illegal memory access on the H100."""
    rows = [Compiled(**r) for r in compiled["bfloat16"] if r["kernel"] == "_fused_bwd_kernel"]
    assert {c.constexprs["BV"] for c in rows} == {64, 128}, [c.constexprs for c in rows]
    assert all(c.mma_n for c in rows), [_row(c) for c in rows]
    narrow = [_row(c) for c in rows if min(c.mma_n) < 32]
    assert not narrow, "wgmma narrower than n = 32:\n" + "\n".join(narrow)


def test_fp32_config_changes_only_the_tile_settings_fp32_needs() -> None:
    """fp16 launches with bf16's settings (so compiling one of them answers for both), fp32 with
    smaller bwd_dqk tiles and fewer pipeline stages; overrides apply on top of either."""
    from dataclasses import fields

    half = gdn_config.kernel_config(torch.bfloat16)
    assert gdn_config.kernel_config(torch.float16) == half == gdn_config.DEFAULT
    fp32 = gdn_config.kernel_config(torch.float32)
    differ = {f.name for f in fields(half) if getattr(half, f.name) != getattr(fp32, f.name)}
    assert differ == {"state_stages", "dqk_bk", "dqk_bv", "dqk_warps"}
    with gdn_config.config_overrides(state_bv=16):
        assert gdn_config.kernel_config(torch.float32) == fp32.replace(state_bv=16)
        assert gdn_config.kernel_config(torch.bfloat16).state_bv == 16
    assert gdn_config.kernel_config(torch.bfloat16) == half
    with pytest.raises(ValueError, match=r"unknown KernelConfig field\(s\) \['fused_fwd'\]"):
        gdn_config.config_overrides(fused_fwd=1).__enter__()


def test_npu_device_gets_the_npu_fields() -> None:
    """kernel_config on an "npu" device (torch_npu's name for the privateuse1 backend, renamed here
    in a child process as torch_npu does) applies NPU_FIELDS on top of the dtype's defaults, and
    the overrides on top of those; CPU and CUDA devices keep the defaults."""
    code = (
        "import torch\n"
        "from kernels.gdn.config import DEFAULT, DEFAULT_FP32, NPU_FIELDS, config_overrides, kernel_config\n"
        "torch.utils.rename_privateuse1_backend('npu')\n"
        "npu = torch.device('npu')\n"
        "assert kernel_config(torch.bfloat16, npu) == DEFAULT.replace(**NPU_FIELDS)\n"
        "assert kernel_config(torch.float32, npu) == DEFAULT_FP32.replace(**NPU_FIELDS)\n"
        "with config_overrides(f32_dot_scan='hf32'):\n"
        "    assert kernel_config(torch.bfloat16, npu).f32_dot_scan == 'hf32'\n"
        "assert kernel_config(torch.bfloat16, torch.device('cpu')) == DEFAULT\n"
        "assert kernel_config(torch.bfloat16, torch.device('cuda')) == DEFAULT\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert gdn_config.NPU_FIELDS == {"f32_dot_tm": "hf32", "f32_dot_wu": "hf32", "f32_dot_inv": "ieee",
                                     "f32_dot_scan": "ieee", "f32_dot_vn": "hf32", "t_fp16": False}
    npu_bf16 = gdn_config.DEFAULT.replace(**gdn_config.NPU_FIELDS)
    assert gdn_config.t_dtype(npu_bf16, torch.bfloat16) == torch.float32


def test_dot_precision_of_the_scan_and_hf32() -> None:
    """The scan group's precision is its field for every input dtype (it multiplies fp32 maps);
    hf32 is accepted; a name outside the list is refused with the list."""
    cfg = gdn_config.DEFAULT
    assert gdn_config.dot_precision(cfg, torch.float32, "scan") == "tf32x3"
    assert gdn_config.dot_precision(cfg.replace(f32_dot_scan="ieee"), torch.bfloat16, "scan") == "ieee"
    assert gdn_config.dot_precision(cfg.replace(f32_dot_wu="hf32"), torch.bfloat16, "wu") == "hf32"
    assert gdn_config.dot_precision(cfg.replace(f32_dot_wu="hf32"), torch.float32, "wu") == "ieee"
    with pytest.raises(ValueError, match=r"f32_dot_scan = 'low'; expected tf32, tf32x3, ieee or hf32$"):
        gdn_config.dot_precision(cfg.replace(f32_dot_scan="low"), torch.bfloat16, "scan")
    with pytest.raises(ValueError, match=r"f32_dot_wu = 'split'; expected tf32, tf32x3, ieee, hf32 or low$"):
        gdn_config.dot_precision(cfg.replace(f32_dot_wu="split"), torch.bfloat16, "wu")
    assert gdn_config.dot_precision(cfg, torch.bfloat16, "wu") == "bf16"
    assert gdn_config.dot_precision(cfg, torch.float16, "wu") == "fp16"


def test_override_for_run_lasts_and_stays_in_its_context() -> None:
    """A script's --set: the fields hold for every later call of the run (also after a garbage
    collection, which undoes a dropped `config_overrides`), only in the context that set them;
    an unknown field is refused with its name."""
    import contextvars
    import gc

    def run() -> tuple[int, str]:
        gdn_config.override_for_run(intra_wu_bd=64, f32_dot_wu="tf32")
        gc.collect()
        cfg = gdn_config.kernel_config(torch.bfloat16)
        return cfg.intra_wu_bd, cfg.f32_dot_wu

    assert contextvars.copy_context().run(run) == (64, "tf32")
    assert gdn_config.kernel_config(torch.bfloat16) == gdn_config.DEFAULT
    with pytest.raises(ValueError, match="intra_wu_bs"):
        contextvars.copy_context().run(gdn_config.override_for_run, intra_wu_bs=32)


if __name__ == "__main__":
    table = {}
    chosen = DTYPES if "--full" in sys.argv else COMPILED_DTYPES
    if "--dtype" in sys.argv:  # one dtype only
        chosen = (getattr(torch, sys.argv[sys.argv.index("--dtype") + 1]),)
    if "--queue" in sys.argv:  # a worker of the fixture: compile what it claims from the shared queue
        print(json.dumps(serve_queue(chosen, sys.argv[sys.argv.index("--queue") + 1])))
        sys.exit(0)
    for dt in chosen:
        table[str(dt).split(".")[-1]] = rows = []
        for c in compile_all(dt, full="--full" in sys.argv):
            rows.append(asdict(c))
            if "--json" not in sys.argv:
                print(_row(c), "OVER" if c.shared > HOPPER_SMEM else "", flush=True)
    if "--json" in sys.argv:
        print(json.dumps(table))
