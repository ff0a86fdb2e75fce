"""The one door of gdn's communication: every collective and point-to-point message goes through
here, so one place knows what the process group's library accepts and how a wait is bounded.

Two rule sets:
- "native" (gloo, NCCL): what torch.distributed accepts; `Work.wait(timeout)` is honoured.
- "hccl" (Ascend): what HCCL accepts on Atlas A2/A3 (CANN HCCL API reference; torch_npu's
  ProcessGroupHCCL): reductions (all-reduce, reduce-scatter) only in int8/int16/int32/int64/
  fp16/fp32/bf16 with SUM/PROD/MAX/MIN (PROD not for int16/bf16), so no fp64 and no AVG or
  PREMUL_SUM; data movement (all-gather, all-to-all, broadcast, send/recv) also takes uint8,
  bool and fp64; nothing complex. torch_npu's `WorkHCCL.wait(timeout)` ignores its argument,
  so a bounded wait polls `is_completed()` against the limit.

The "hccl" rules apply on a group whose backend is hccl (a real NPU job), and everywhere when
the environment sets `GDNVAL_COLLECTIVES=hccl`: the CPU emulation of an NPU job on gloo. There
the work handles of asynchronous calls behave like HCCL's (completion is observable through
`is_completed()`; `wait(timeout)` is refused), so a CPU run proves the NPU path's traffic legal.
A refusal is a `CollectiveRefused` naming the call site (file:line in function) and the reason.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

COLLECTIVES_ENV = "GDNVAL_COLLECTIVES"
RULE_SETS: tuple[str, ...] = ("native", "hccl")

# HCCL's data types (Atlas A2/A3), by kind of operation.
HCCL_REDUCE_DTYPES: frozenset[torch.dtype] = frozenset(
    {torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.bfloat16}
)
HCCL_MOVE_DTYPES: frozenset[torch.dtype] = HCCL_REDUCE_DTYPES | {torch.uint8, torch.bool, torch.float64}
HCCL_REDUCE_OPS: dict[Any, str] = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
}
HCCL_NO_PROD_DTYPES: frozenset[torch.dtype] = frozenset({torch.int16, torch.bfloat16})
_POLL_S = 5e-5  # first poll interval of a bounded wait; doubles up to _POLL_MAX_S
_POLL_MAX_S = 1e-3  # a CP chain step waits this much at most beyond its transfer
_HERE = Path(__file__).resolve()
_ROOT = _HERE.parent.parent


class CollectiveRefused(RuntimeError):
    """A collective the active rules do not allow (e.g. an fp64 all-reduce under HCCL's rules)."""


class CollectiveTimeout(RuntimeError):
    """A bounded wait ran out; the message names the transfer and the limit."""


def emulated_rules() -> str:
    """The rule set the environment asks for ("native" when unset)."""
    value = os.environ.get(COLLECTIVES_ENV, "native") or "native"
    if value not in RULE_SETS:
        raise ValueError(
            f"{COLLECTIVES_ENV}={value!r} is not a rule set; expected one of {', '.join(RULE_SETS)}"
        )
    return value


def rules(group: dist.ProcessGroup | None = None) -> str:
    """"hccl" on an hccl group or under the emulation, else "native"."""
    if emulated_rules() == "hccl":
        return "hccl"
    if dist.is_initialized() and dist.get_backend(group) == "hccl":
        return "hccl"
    return "native"


def _emulating(group: dist.ProcessGroup | None) -> bool:
    """HCCL's rules on a backend that is not HCCL: work handles need the HCCL-like wrapper."""
    return emulated_rules() == "hccl" and dist.get_backend(group) != "hccl"


def call_site() -> str:
    """`path:line in function` of the first caller outside this module."""
    frame = sys._getframe(1)
    while frame is not None and Path(frame.f_code.co_filename).resolve() == _HERE:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    path = Path(frame.f_code.co_filename).resolve()
    shown = path.relative_to(_ROOT).as_posix() if path.is_relative_to(_ROOT) else path.name
    return f"{shown}:{frame.f_lineno} in {frame.f_code.co_qualname}"


def _refuse(op: str, what: str, reason: str) -> None:
    raise CollectiveRefused(f"{op} of {what} at {call_site()} refused under HCCL's rules: {reason}")


def check_reduce(
    t: torch.Tensor, op: Any, group: dist.ProcessGroup | None, what: str, kind: str = "all_reduce"
) -> None:
    """Refuse a reduction HCCL would refuse (dtype or op); nothing under the native rules."""
    if rules(group) != "hccl":
        return
    if t.dtype not in HCCL_REDUCE_DTYPES:
        allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in HCCL_REDUCE_DTYPES))
        _refuse(kind, what, f"HCCL reduces no {str(t.dtype).removeprefix('torch.')} (it reduces {allowed}); "
                            "reduce in fp32, or gather and sum locally (collectives.sum_over)")
    if op not in HCCL_REDUCE_OPS:
        _refuse(kind, what, f"HCCL has no reduce op {op}; it has {', '.join(HCCL_REDUCE_OPS.values())}")
    if op == dist.ReduceOp.PRODUCT and t.dtype in HCCL_NO_PROD_DTYPES:
        _refuse(kind, what, f"HCCL's prod does not take {t.dtype}")


def check_move(t: torch.Tensor, group: dist.ProcessGroup | None, what: str, kind: str) -> None:
    """Refuse a data movement of a dtype HCCL does not carry."""
    if rules(group) == "hccl" and t.dtype not in HCCL_MOVE_DTYPES:
        _refuse(kind, what, f"HCCL carries no {t.dtype}")


# ------------------------------------------------------------------------------------------
# Work handles


class HcclLikeWork:
    """A gloo work handle that behaves like torch_npu's WorkHCCL for the caller.

    Completion is observable through `is_completed()` (a helper thread finishes the gloo wait;
    gloo's point-to-point handles complete only inside `wait`), an untimed `wait()` returns once
    the transfer is done, and `wait(timeout)` is refused: HCCL would silently ignore the limit.
    """

    def __init__(self, work: dist.Work, what: str) -> None:
        self._work = work
        self.what = what
        self._done = threading.Event()
        self._error: BaseException | None = None
        threading.Thread(target=self._finish, name="gdnval-hccl-like-wait", daemon=True).start()

    def _finish(self) -> None:
        try:
            self._work.wait()
        except BaseException as exc:  # handed to the waiter
            self._error = exc
        finally:
            self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: timedelta | None = None) -> bool:
        if timeout is not None:
            raise CollectiveRefused(
                f"Work.wait(timeout={timeout}) on {self.what} at {call_site()} refused under HCCL's "
                "rules: torch_npu's WorkHCCL.wait ignores the timeout (HCCL_BLOCKING_WAIT bounds it by "
                "the process-group timeout only); bound the wait with collectives.wait (polls is_completed)"
            )
        self._done.wait()
        if self._error is not None:
            raise self._error
        return True


def _handle(work: dist.Work | None, group: dist.ProcessGroup | None, what: str) -> Any:
    if work is None or not _emulating(group):
        return work
    return HcclLikeWork(work, what)


def wait(work: Any, timeout: timedelta, what: str, group: dist.ProcessGroup | None = None) -> None:
    """Wait for `work` at most `timeout`; `CollectiveTimeout` (or the transfer's own error) after.

    Native: `work.wait(timeout)`. HCCL: poll `is_completed()` against the limit, then the untimed
    `wait()` that joins the transfer to the current stream.
    """
    if not isinstance(work, HcclLikeWork) and (work is None or rules(group) != "hccl"):
        if work is not None:
            try:
                work.wait(timeout)
            except RuntimeError as exc:
                raise CollectiveTimeout(f"{what} failed or timed out after {timeout}: {exc}") from exc
        return
    limit = time.monotonic() + timeout.total_seconds()
    pause = _POLL_S
    while not work.is_completed():
        if time.monotonic() > limit:
            raise CollectiveTimeout(
                f"{what} did not complete within {timeout} (polled is_completed(); HCCL honours no "
                "Work.wait(timeout))"
            )
        time.sleep(pause)
        pause = min(2 * pause, _POLL_MAX_S)
    try:
        work.wait()
    except RuntimeError as exc:
        raise CollectiveTimeout(f"{what} failed: {exc}") from exc


# ------------------------------------------------------------------------------------------
# Operations


def all_reduce(
    t: torch.Tensor, group: dist.ProcessGroup | None, what: str, *, op: Any = dist.ReduceOp.SUM,
    async_op: bool = False,
) -> Any:
    """In-place all-reduce of `t` (a work handle when `async_op`)."""
    check_reduce(t, op, group, what)
    return _handle(dist.all_reduce(t, op=op, group=group, async_op=async_op), group, what)


def all_gather_into(
    out: torch.Tensor, x: torch.Tensor, group: dist.ProcessGroup | None, what: str, *, async_op: bool = False
) -> Any:
    """Flat all-gather: `out` (P·numel) receives every rank's `x` in rank order."""
    check_move(x, group, what, "all_gather")
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.10+
    return _handle(gather(out, x, group=group, async_op=async_op), group, what)


def all_gather_list(
    parts: list[torch.Tensor], x: torch.Tensor, group: dist.ProcessGroup | None, what: str
) -> None:
    """All-gather into a list of per-rank tensors (synchronous)."""
    check_move(x, group, what, "all_gather")
    dist.all_gather(parts, x, group=group)


def all_to_all_single(
    out: torch.Tensor, x: torch.Tensor, group: dist.ProcessGroup | None, what: str, *, async_op: bool = False
) -> Any:
    check_move(x, group, what, "all_to_all")
    return _handle(dist.all_to_all_single(out, x, group=group, async_op=async_op), group, what)


def isend(t: torch.Tensor, dst: int, group: dist.ProcessGroup | None, tag: int, what: str) -> Any:
    """Start a send to global rank `dst` (HCCL ignores tags: the program order must match)."""
    check_move(t, group, what, "send")
    return _handle(dist.isend(t, dst=dst, group=group, tag=tag), group, what)


def irecv(t: torch.Tensor, src: int, group: dist.ProcessGroup | None, tag: int, what: str) -> Any:
    check_move(t, group, what, "recv")
    return _handle(dist.irecv(t, src=src, group=group, tag=tag), group, what)


def broadcast_object_list(payload: list[Any], src: int, group: dist.ProcessGroup | None, what: str) -> None:
    """Pickled objects from global rank `src` (uint8 tensors on the wire: legal everywhere)."""
    dist.broadcast_object_list(payload, src=src, group=group)


def barrier(group: dist.ProcessGroup | None, what: str) -> None:
    dist.barrier(group=group)


def sum_over(
    t: torch.Tensor, group: dist.ProcessGroup | None, what: str, *, timeout: timedelta | None = None
) -> torch.Tensor:
    """The sum of `t` over the group: an in-place all-reduce; for fp64 an all-gather and a local sum
    in rank order, on every backend (HCCL moves fp64 but does not reduce it, and CPU runs then
    take the path an NPU run takes). The fp64 sum keeps every digit, and every rank adds the same
    values in the same order, so all get the same bits. With `timeout` the transfer is bounded
    (`CollectiveTimeout`)."""
    if t.dtype != torch.float64:
        work = all_reduce(t, group, what, async_op=timeout is not None)
        if timeout is not None:
            wait(work, timeout, what, group)
        return t
    size = dist.get_world_size(group)
    flat = t.detach().contiguous().view(-1)
    out = flat.new_empty(size * flat.numel())
    work = all_gather_into(out, flat, group, what, async_op=timeout is not None)
    if timeout is not None:
        wait(work, timeout, what, group)
    # the local sum on the host: accelerators' fp64 arithmetic is not a given (Ascend)
    return out.cpu().view(size, *t.shape).sum(dim=0).to(t.device)


def gathered_max(t: torch.Tensor, group: dist.ProcessGroup | None, what: str) -> torch.Tensor:
    """Element-wise max of `t` over the group in `t`'s precision (all-gather + local max)."""
    size = dist.get_world_size(group)
    flat = t.detach().contiguous().view(-1)
    out = flat.new_empty(size * flat.numel())
    all_gather_into(out, flat, group, what)
    return out.view(size, *t.shape).amax(dim=0)


def check_fsdp_dtypes(params: list[torch.Tensor], group: dist.ProcessGroup | None, what: str) -> None:
    """FSDP's own collectives do not pass through here: refuse, before they start, parameters whose
    gradient reduce-scatter HCCL would refuse."""
    for p in params:
        check_reduce(p, dist.ReduceOp.SUM, group, what, kind="reduce_scatter")
