"""Test-only suite for the hardening tests: a rank that hangs and ranks that start children.

`tree-probe` has a tiny default deadline (startup 15 s, 1 s per case), so a hung rank ends its
job quickly with nothing configured. `make_executor` (named by `GDNVAL_EXECUTOR=tests.
hardening_suites_for_tests:make_executor`) registers the suite and returns the real local
executor.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from workers import registry
from workers.context import RankContext
from workers.executors.base import Executor
from workers.suite import Case, Metric, Sample, Suite, SuiteParams

NAME = "tree-probe"


class TreeParams(SuiteParams):
    hang: bool = True  # the second case sleeps forever
    child: str = "none"  # none | group (same process group) | setsid (a session of its own)
    pid_file: str = ""  # where rank 0 writes "<rank pid> <child pid>"


class TreeSuite(Suite):
    name = NAME
    description = "hang / child-process probe (tests only)"
    params_model = TreeParams
    presets: ClassVar = {"quick": {}}
    metrics = (Metric("ok", "bool", "check", direction="higher", bound=1.0),)
    devices = ("cpu",)
    deadline_startup_s = 15.0
    deadline_per_case_s: ClassVar = {"quick": 1.0}

    def cases(self, params: SuiteParams) -> list[Case]:
        p = params.model_dump()
        return [Case(NAME, "start", p), Case(NAME, "hang", p)]

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        p = case.params
        if case.name == "start":
            if p["child"] != "none" and ctx.rank == 0:
                child = subprocess.Popen(["sleep", "1000"], start_new_session=p["child"] == "setsid")
                if p["pid_file"]:
                    tmp = Path(p["pid_file"] + ".tmp")
                    tmp.write_text(f"{os.getpid()} {child.pid}")
                    tmp.replace(p["pid_file"])
            yield Sample(case.name, "ok", 1.0, rank=ctx.rank)
        elif p["hang"]:
            while True:
                time.sleep(3600)
        else:
            yield Sample(case.name, "ok", 1.0, rank=ctx.rank)


SUITE = TreeSuite()


def make_executor() -> Executor:
    from workers.executors.local import LocalExecutor

    registry.SUITE_MODULES.setdefault(NAME, __name__)
    return LocalExecutor(cpu_max_world_size=2)
