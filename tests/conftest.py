"""Test-wide setup: without a GPU, Triton kernels run under its CPU interpreter and `gpu` tests
skip; the fixtures that tests of several packages use. A package's own fixtures live in its
conftest (tests/service)."""

from __future__ import annotations

import atexit
import fnmatch
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

if shutil.which("nvidia-smi") is None:
    # Must be set before anything imports triton; GPU machines run the compiled kernels.
    os.environ.setdefault("TRITON_INTERPRET", "1")

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
if "GDNVAL_DB_URL" not in os.environ or os.environ.get("GDNVAL_TEST_RUNS_OF") not in (None, _WORKER):
    # `gdnval run` keeps each run in the results store (default: ./gdnval.db): the tests' runs,
    # in this process and in the CLI processes they start, go to a store of this session's own,
    # one per pytest-xdist worker (a worker inherits the environment of the process that made it)
    _RUNS = tempfile.mkdtemp(prefix="gdnval-test-runs-")
    atexit.register(shutil.rmtree, _RUNS, ignore_errors=True)
    os.environ["GDNVAL_DB_URL"] = f"sqlite:///{_RUNS}/runs.db"
    os.environ["GDNVAL_TEST_RUNS_OF"] = _WORKER


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    # pytest-xdist sends modules out in this order: LEAD, then the modules with slow tests, in file
    # order within each group (a stable sort)
    slow_modules = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: (lead_rank(item.nodeid), item.path not in slow_modules))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Test modules that must share a pytest-xdist worker, by path pattern: the Ray modules start local
# Ray clusters, and Ray's state API and `ray.init()` find the newest cluster on the machine; the
# backend-gate modules reuse the jobs each other measured in the session's `backend_store`.
SHARED_WORKER = {
    "tests/workers/test_ray_*.py": "ray clusters",
    "tests/e2e/test_backend_gate.py": "backend store",
    "tests/service/domain/test_gate_eager_reuse.py": "backend store",
}


# The units sent out first, one to each worker: the two longest, which judge no timing. The gate and
# find tests judge timings, and a saturated machine asks them for more confirmation rounds: beside
# the campaign's eight CPU ranks test_find took 185 s, elsewhere 70 s.
LEAD = ("tests/e2e/test_campaign.py", "tests/workers/test_ray_*.py")


def matching_pattern(nodeid: str, patterns: Iterable[str]) -> str | None:
    """The first of `patterns` (fnmatch, on paths from the root) that a test's module matches."""
    module = nodeid.split("::", 1)[0]
    return next((pattern for pattern in patterns if fnmatch.fnmatch(module, pattern)), None)


def shared_unit(nodeid: str) -> str | None:
    """The SHARED_WORKER unit of a test's module, or None."""
    return SHARED_WORKER.get(matching_pattern(nodeid, SHARED_WORKER) or "")


def lead_rank(nodeid: str) -> int:
    """A test's module's place in LEAD, len(LEAD) when it is not there."""
    pattern = matching_pattern(nodeid, LEAD)
    return LEAD.index(pattern) if pattern else len(LEAD)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`-n 2`) each test module runs whole on one worker, so its module-scoped
    fixtures (servers, clusters, repositories) start once, and the modules of one SHARED_WORKER
    unit run one after another on one worker. Units go out in collection order
    (`pytest_collection_modifyitems`: LEAD, then the modules with slow tests), so the longest
    start early and no worker idles at the end."""
    if config.option.dist not in ("load", "loadfile", "loadscope"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return shared_unit(nodeid) or nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False
    return ModuleScheduling(config, log)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Intra-op threads spin against the other processes on a shared 2-core machine (30x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gdn.data's built-in sample text as a token file, built once per test module (the data tests
    in tests/gdn and the trajectory tests in tests/workers read it)."""
    from gdn.data import build_sample_token_file

    path = tmp_path_factory.mktemp("tokens") / "sample.bin"
    build_sample_token_file(path)
    return path


@pytest.fixture(scope="session")
def backend_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The backend repository of tests/support/backend_repo.py and the store its gates run
    against, once per session: the backend-gate tests (tests/e2e, tests/service/domain) each serve
    it (`serve_backend_store`) and reuse the jobs the others measured."""
    from tests.support.backend_repo import make_backend_store

    return make_backend_store(tmp_path_factory.mktemp("backend-store"))
