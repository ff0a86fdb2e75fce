"""The suite catalogue: each name maps to its suite's spec module, which defines `SUITE` and imports
no torch. Specs are imported on demand; a suite's run module is imported by `Suite.run`, on a rank."""

from __future__ import annotations

import importlib
from functools import cache

from workers.suite import Suite, UnknownSuiteInput

SUITE_MODULES: dict[str, str] = {
    # name -> spec module defining `SUITE`, an instance of workers.suite.Suite
    "capability": "workers.suites.capability.spec",
    "gdn-op": "workers.suites.gdn_op.spec",
    "cp-layer": "workers.suites.cp_layer.spec",
    "network": "workers.suites.network.spec",
    "stability": "workers.suites.stability.spec",
    "profile": "workers.suites.profile.spec",
}


def suite_names() -> list[str]:
    return sorted(SUITE_MODULES)


@cache
def get_suite(name: str) -> Suite:
    if name not in SUITE_MODULES:
        raise UnknownSuiteInput(f"unknown suite {name!r}; expected one of {suite_names()}")
    suite = importlib.import_module(SUITE_MODULES[name]).SUITE
    if suite.name != name:
        raise RuntimeError(f"module {SUITE_MODULES[name]} defines suite {suite.name!r}, expected {name!r}")
    return suite
