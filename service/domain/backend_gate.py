"""What a gate on a backend's own repository runs: the suites that call that backend, and how.

A backend's author gates commits of *their* repository, so every job must exercise their core:
gdn-op and capability run it beside its reference (`eager`), gdn-op timing both (the CPU gate
preset times only `eager` otherwise, so a slower backend would pass unseen); cp-layer runs it
under the CP layouts the world size allows (Ulysses and P2P from 2 ranks; the one-process P2P
emulation on one), against the no-CP layer on the reference. Request parameters are applied on
top, and a suite whose resolved jobs would never call the backend is refused, naming what they
would call instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.registry import get_suite
from workers.suite import UnknownSuiteInput

REFERENCE = "eager"  # the backend every gated one is timed and checked beside
BACKEND_SUITES = ("gdn-op", "capability", "cp-layer")


class NeverCallsBackend(ValueError):
    """A gated suite's jobs, as resolved, would not run the backend under test."""


def backend_params(suite: str, backend: str, world_size: int) -> dict[str, Any]:
    """The parameters that make `suite` call `backend` (empty for a suite that names no backend)."""
    if suite == "gdn-op":
        both = [REFERENCE, backend]
        return {"backends": both, "baseline": REFERENCE, "timed_backends": both}
    if suite == "capability":
        return {"backends": [REFERENCE, backend]}
    if suite == "cp-layer":
        modes = ("ulysses", "p2p") if world_size >= 2 else ("p2p_emulated",)
        return {"candidates": [f"{m}+{backend}" for m in modes], "ref_backend": REFERENCE}
    return {}


def suite_params(
    suite: str, backend: str | None, world_size: int, overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """The overrides a gated suite's jobs get: the backend's (when one is gated), then the request's."""
    base = backend_params(suite, backend, world_size) if backend else {}
    return {**base, **overrides}


def check_calls_backend(
    suite: str, preset: str, params: Mapping[str, Any], backend: str, device: str
) -> None:
    """Raise NeverCallsBackend unless the suite's jobs with these parameters run `backend` (and,
    where the suite times selected backends, time it)."""
    s = get_suite(suite)
    try:
        resolved = s.resolve_params(preset, params, device)
    except UnknownSuiteInput:
        return  # the submission check names the bad parameter
    called = s.backends(resolved)
    if backend not in called:
        raise NeverCallsBackend(
            f"suite {suite!r} with preset {preset!r} would never call backend {backend!r} "
            f"(its jobs call {list(called)}); drop the --param that replaces it, or gate "
            f"{', '.join(BACKEND_SUITES)} without --suite"
        )
    timed = getattr(resolved, "timed_backends", None)
    if timed is not None and getattr(resolved, "timing", True) and backend not in timed:
        raise NeverCallsBackend(
            f"suite {suite!r} with preset {preset!r} runs backend {backend!r} but times only "
            f"{list(timed)}; a slower {backend!r} would pass unseen: add it to timed_backends"
        )
