"""What a backend can run: the problem size of one call (`GDNShape`), the refusal every
backend raises instead of falling back (`UnsupportedGDNRequest`), and the Triton backend's
capability check.

Both `gdn.ops` (the dispatch) and `gdn.backends` (the backends) build on this module, which
imports neither of them, so the dispatch imports the backends and nothing imports back.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass

import torch

TRITON_HEAD_DIM = 128
TRITON_CHUNK_SIZE = 64
TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class UnsupportedGDNRequest(ValueError):
    """A request the chosen backend does not support; raised instead of any fall-back."""


@dataclass(frozen=True)
class GDNShape:
    """Problem size of one call: batch, tokens, q/k heads, value heads, key and value head dims,
    and the number of packed sequences (None: a dense batch, no `cu_seqlens`)."""

    batch: int
    seq_len: int
    num_qk_heads: int
    num_v_heads: int
    head_dim_k: int = 128
    head_dim_v: int = 128
    num_seqs: int | None = None

    @classmethod
    def of(cls, q: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> GDNShape:
        n = None if cu_seqlens is None else cu_seqlens.numel() - 1
        return cls(q.shape[0], q.shape[1], q.shape[2], v.shape[2], q.shape[3], v.shape[3], n)


TRITON_ASCEND = "triton-ascend"  # Triton's Ascend build: it installs as the `triton` package


def triton_ascend_version() -> str | None:
    """The installed triton-ascend's version, or None; read from the package metadata, so
    nothing is imported (the `triton` module alone does not say which build it is)."""
    try:
        return importlib.metadata.version(TRITON_ASCEND)
    except importlib.metadata.PackageNotFoundError:
        return None


def triton_interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_triton_gdn(
    shape: GDNShape | tuple[int, ...],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    chunk_size: int = TRITON_CHUNK_SIZE,
) -> None:
    """Raise `UnsupportedGDNRequest` naming the reason when the Triton backend cannot run `shape`.

    `device` defaults to the current CUDA device when there is one, else the CPU.
    """
    if not isinstance(shape, GDNShape):
        shape = GDNShape(*shape)
    if chunk_size != TRITON_CHUNK_SIZE:
        raise UnsupportedGDNRequest(
            f"chunk_size={chunk_size} is not supported by the Triton backend; it supports only "
            f"chunk_size={TRITON_CHUNK_SIZE}"
        )
    if shape.head_dim_k != TRITON_HEAD_DIM or shape.head_dim_v != TRITON_HEAD_DIM:
        raise UnsupportedGDNRequest(
            f"head_dim (k={shape.head_dim_k}, v={shape.head_dim_v}) is not supported by the Triton "
            f"backend; it supports only head_dim={TRITON_HEAD_DIM}"
        )
    if min(shape.batch, shape.seq_len, shape.num_qk_heads, shape.num_v_heads) < 1:
        raise UnsupportedGDNRequest(f"empty problem {shape}: batch, seq_len and heads must be >= 1")
    if shape.num_v_heads % shape.num_qk_heads:
        raise UnsupportedGDNRequest(
            f"num_v_heads={shape.num_v_heads} is not a multiple of num_qk_heads={shape.num_qk_heads}"
        )
    if dtype not in TRITON_DTYPES:
        raise UnsupportedGDNRequest(
            f"dtype {dtype} is not supported by the Triton backend; expected one of "
            f"{', '.join(str(d) for d in TRITON_DTYPES)}"
        )
    if device is None:
        from gdn import device as devices

        device = "cuda" if devices.is_available("cuda") else "cpu"
    # torch knows the kind "npu" only once torch_npu is imported: read it from the string
    kind = device.type if isinstance(device, torch.device) else str(device).partition(":")[0]
    # The device first: on an NPU the real reason is triton-ascend, whether a Triton is installed or not.
    if kind == "npu":
        if triton_ascend_version() is None:
            raise UnsupportedGDNRequest(
                f"the Triton backend on npu needs {TRITON_ASCEND} (Triton's Ascend build, installed "
                f"by docker/Dockerfile.npu), which is not installed here; install it, or name "
                f"backend='eager' to run the reference only"
            )
    elif kind not in ("cpu", "cuda"):
        raise UnsupportedGDNRequest(
            f"the Triton backend needs CUDA, an Ascend NPU with {TRITON_ASCEND}, or CPU under "
            f"TRITON_INTERPRET=1, not {kind!r} tensors; on {kind} use backend='eager'"
        )
    if importlib.util.find_spec("triton") is None:
        raise UnsupportedGDNRequest(
            "backend='triton' requested but Triton is not installed (pip install 'gdnval[triton]'); "
            "use backend='eager'"
        )
    if kind == "cpu" and not triton_interpreter_on():
        raise UnsupportedGDNRequest(
            "backend='triton' on CPU tensors needs the Triton interpreter (TRITON_INTERPRET=1); "
            "move the tensors to a CUDA device or use backend='eager'"
        )


def is_triton_gdn_available(
    shape: GDNShape | tuple[int, ...],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    chunk_size: int = TRITON_CHUNK_SIZE,
) -> bool:
    """True when `check_triton_gdn` passes and the kernel module imports on this machine."""
    try:
        check_triton_gdn(shape, device=device, dtype=dtype, chunk_size=chunk_size)
        importlib.import_module("kernels.gdn")
    except (UnsupportedGDNRequest, ImportError, RuntimeError):
        return False
    return True
