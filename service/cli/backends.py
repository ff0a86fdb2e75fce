"""`gdnval backends`: the core backends that resolve here, where each comes from, and (with a
shape) whether each one takes it.

Built-ins, then the `gdnval.backends` entry points installed in this environment, then any
`--backend NAME` asked for (a `module:function` one-off). `--backend-source SRC` installs a
source as a job would (workers.backend_source) and lists what it adds. With `--seq-len` each
backend's capability check answers for that shape ("declares: ok" or "declares: refuses (its
reason)"), and each backend that accepts it is called once, forward and backward, at that shape
cut to `TINY_T` tokens ("ok", or what it raised or got wrong). A backend that does not load shows
why. Exit 0; 1 when a backend accepts the shape and its call fails; 2 when the source cannot be
installed or a `--backend` does not resolve.
"""

from __future__ import annotations

from typing import Any

import click

from service.cli.client import fail
from service.domain import exit_codes

DTYPES = ("float64", "float32", "float16", "bfloat16")


def use_backend_source(source: str) -> str:
    """Install `source` (as the executors do, into the same cache) and put it first on this
    process's path; returns the folder. One line and exit 2 when it cannot be installed."""
    import importlib
    import sys

    from workers.backend_source import BackendSourceError, install_backend_source

    try:
        folder = install_backend_source(source)
    except BackendSourceError as exc:
        fail(f"--backend-source {source!r}: {exc}")
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    return str(folder)


def origin(name: str) -> tuple[str, str | None]:
    """(where backend `name` comes from, why it does not load or None)."""
    from gdn.backends import get_backend
    from gdn.backends.builtin import BUILTINS
    from gdn.ops import UnsupportedGDNRequest
    from workers.provenance import backend_provenance

    try:
        get_backend(name)
    except UnsupportedGDNRequest as exc:
        return "unresolved", str(exc)
    prov = backend_provenance(name)
    kind = "built-in" if name in BUILTINS else ("one-off" if ":" in name else "entry point")
    where = prov.get("distribution") or prov.get("module") or "?"
    version = f" {prov['version']}" if prov.get("version") else ""
    commit = f" @ {str(prov['commit'])[:12]}" if prov.get("commit") else ""
    return f"{kind}: {where}{version}{commit}", None


TINY_T = 64  # the tokens of the call `--seq-len` makes to each backend that accepts the shape


def tiny_call(name: str, shape: Any, dtype: str, device: str) -> str | None:
    """One forward and backward of backend `name` at `shape` cut to `TINY_T` tokens, on random
    inputs: None when it returns finite outputs of the right shapes and gradients for every input,
    else what went wrong (what a job would find on its first case, found in a second)."""
    import torch

    from gdn.backends import get_backend

    dt, dev = getattr(torch, dtype), torch.device(device)
    b, t, hq, hv = shape.batch, min(shape.seq_len, TINY_T), shape.num_qk_heads, shape.num_v_heads
    dk, dv = shape.head_dim_k, shape.head_dim_v
    gen = torch.Generator().manual_seed(0)

    def rand(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*size, generator=gen)).to(dev, dt).requires_grad_()

    q, v = rand(b, t, hq, dk), rand(b, t, hv, dv)
    k = torch.nn.functional.normalize(torch.randn(b, t, hq, dk, generator=gen), dim=-1).to(dev, dt)
    k.requires_grad_()
    g = (-torch.rand(b, t, hv, generator=gen)).to(dev, torch.float32).requires_grad_()
    beta = torch.rand(b, t, hv, generator=gen).to(dev, dt).requires_grad_()
    h0 = torch.zeros(b, hv, dk, dv, device=dev, dtype=torch.float32, requires_grad=True)
    try:
        o, ht = get_backend(name).fn(q, k, v, g, beta, scale=dk ** -0.5, initial_state=h0,
                                     output_final_state=True, cu_seqlens=None)
        if tuple(o.shape) != tuple(v.shape):
            return f"output {tuple(o.shape)}, expected {tuple(v.shape)}"
        if ht is None or tuple(ht.shape) != tuple(h0.shape):
            return f"final state {None if ht is None else tuple(ht.shape)}, expected {tuple(h0.shape)}"
        (o.float().sum() + ht.float().sum()).backward()
    except Exception as exc:  # what the backend raised is the answer
        return f"raised {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc) else ''}"
    if not (torch.isfinite(o).all() and torch.isfinite(ht).all()):
        return "non-finite output or final state"
    missing = [n for n, x in zip(("q", "k", "v", "g", "beta", "h0"), (q, k, v, g, beta, h0), strict=True)
               if x.grad is None or not torch.isfinite(x.grad).all()]
    return f"no finite gradient for {', '.join(missing)}" if missing else None


def capability(name: str, shape: Any, dtype: str, device: str) -> str:
    """'ok' or the backend's reason for this shape (its `gdnval_check`)."""
    import torch

    from gdn.backends import get_backend

    reason = get_backend(name).unsupported(shape, getattr(torch, dtype), torch.device(device))
    return "ok" if reason is None else reason


@click.command("backends")
@click.option("--backend", "extra", multiple=True, metavar="NAME",
              help="also resolve this name (a 'module:function' one-off); exit 2 when it does not")
@click.option("--backend-source", default=None, metavar="SRC",
              help="install this source first (git+<repo>@<commit> or a pip requirement), as a job would")
@click.option("--seq-len", type=click.IntRange(min=1), default=None,
              help="check each backend's capability for a call of this many tokens, then call each one "
                   f"that accepts it once ({TINY_T} tokens at most, forward and backward)")
@click.option("--heads", type=click.IntRange(min=1), default=16, show_default=True, help="q/k heads")
@click.option("--v-heads", type=click.IntRange(min=1), default=None, help="value heads [default: --heads]")
@click.option("--head-dim", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda", "npu"]), default="cpu", show_default=True)
def backends(
    extra: tuple[str, ...], backend_source: str | None, seq_len: int | None, heads: int, v_heads: int | None,
    head_dim: int, batch: int, dtype: str, device: str,
) -> None:
    """List the core backends that resolve here, where each comes from and, with --seq-len, whether
    each takes that shape."""
    from gdn.backends import registered_backends
    from gdn.ops import GDNShape, UnsupportedGDNRequest

    if backend_source:
        click.echo(f"backend source {backend_source} installed at {use_backend_source(backend_source)}")
    try:
        names = list(dict.fromkeys([*registered_backends(), *extra]))
    except UnsupportedGDNRequest as exc:
        fail(str(exc))
    shape = None
    if seq_len is not None:
        shape = GDNShape(batch, seq_len, heads, v_heads or heads, head_dim, head_dim)
        click.echo(f"capability for B={batch} T={seq_len} heads={heads}/{v_heads or heads} "
                   f"head_dim={head_dim} {dtype} on {device}:")
    unresolved: list[str] = []
    broken: list[str] = []
    for name in names:
        where, error = origin(name)
        if error is not None:
            click.echo(f"{name}\t{where}: {error}")
            if name in extra:
                unresolved.append(name)
            continue
        line = f"{name}\t{where}"
        if shape is not None:
            declared = capability(name, shape, dtype, device)
            if declared != "ok":
                line += f"\tdeclares: refuses ({declared})"
            else:
                wrong = tiny_call(name, shape, dtype, device)
                line += f"\tdeclares: ok; a {min(seq_len or 0, TINY_T)}-token call: " + (wrong or "ok")
                if wrong is not None:
                    broken.append(name)
        click.echo(line)
    if unresolved:
        fail(f"backend(s) {unresolved} do not resolve here")
    if broken:
        click.echo(f"backend(s) {broken} accept the shape but their call fails", err=True)
        raise SystemExit(exit_codes.FAILED)
