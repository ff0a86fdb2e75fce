"""Backends by name: the built-ins, the `gdnval.backends` entry points, and `module:function`.

A third-party package registers a backend with an entry point in the group `gdnval.backends`:
the entry point's name is the backend's name, its object is either a `Backend` or a plain
callable implementing the protocol (gdn.backends.base), which may carry its capability check as
an attribute `gdnval_check`. `module:function` names a one-off callable without any packaging.
A name that is none of these is refused with the registered names; nothing falls back.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from gdn.backends.base import Backend, supports_everything
from gdn.backends.builtin import BUILTINS
from gdn.capability import UnsupportedGDNRequest

ENTRY_POINT_GROUP = "gdnval.backends"
_LOADED: dict[str, Backend] = {}  # resolved plugins, so a timed call does not rescan entry points


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found and found[ep.name].value != ep.value:
            raise UnsupportedGDNRequest(
                f"backend {ep.name!r} is registered twice in {ENTRY_POINT_GROUP!r}: {found[ep.name].value!r} "
                f"and {ep.value!r}; uninstall one"
            )
        found[ep.name] = ep
    return found


def registered_backends() -> tuple[str, ...]:
    """The built-ins, then the installed entry points' names, sorted."""
    plugins = _entry_points()
    clash = sorted(set(plugins) & set(BUILTINS))
    if clash:
        raise UnsupportedGDNRequest(f"entry point(s) {clash} in {ENTRY_POINT_GROUP!r} reuse a built-in name")
    return (*BUILTINS, *sorted(plugins))


def as_backend(name: str, obj: Any, *, module: str | None, distribution: str | None = None) -> Backend:
    """A loaded object as a `Backend` named `name`: a Backend kept (renamed), a callable wrapped."""
    if isinstance(obj, Backend):
        return replace(obj, name=name, module=obj.module or module,
                       distribution=obj.distribution or distribution)
    if not callable(obj):
        raise UnsupportedGDNRequest(
            f"backend {name!r} resolves to a {type(obj).__name__}, not a callable or a gdn.backends.Backend"
        )
    check = getattr(obj, "gdnval_check", supports_everything)
    return Backend(name, obj, check, module=module, distribution=distribution,
                   description=(obj.__doc__ or "").strip().split("\n")[0])


def _one_off(name: str) -> Backend:
    mod_name, _, attr = name.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise UnsupportedGDNRequest(f"backend {name!r}: module {mod_name!r} does not import: {exc}") from exc
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UnsupportedGDNRequest(f"backend {name!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return as_backend(name, obj, module=mod_name)


def get_backend(name: str | Backend) -> Backend:
    """The backend called `name` (a built-in, an entry point, or `module:function`)."""
    if isinstance(name, Backend):
        return name
    if not isinstance(name, str):
        raise UnsupportedGDNRequest(f"backend must be a name, got {type(name).__name__}")
    if name in BUILTINS:
        return BUILTINS[name]
    if name in _LOADED:
        return _LOADED[name]
    plugins = _entry_points()
    if name in plugins:
        ep = plugins[name]
        try:
            obj = ep.load()
        except Exception as exc:
            raise UnsupportedGDNRequest(
                f"backend {name!r} (entry point {ep.value!r}) failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        dist = ep.dist.name if ep.dist is not None else None
        backend = as_backend(name, obj, module=ep.module, distribution=dist)
    elif ":" in name:
        backend = _one_off(name)
    else:
        names = ", ".join(map(repr, (*BUILTINS, *sorted(plugins))))
        raise UnsupportedGDNRequest(
            f"backend={name!r} is not supported; registered backends: {names} (entry points of "
            f"{ENTRY_POINT_GROUP!r}), or 'module:function' for a one-off; there is no automatic fall-back"
        )
    _LOADED[name] = backend
    return backend
