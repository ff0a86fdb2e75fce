"""Test-wide setup: without a GPU, Triton kernels run under its CPU interpreter and `gpu` tests
skip; the fixtures that tests of several packages use. A package's own fixtures live in its
conftest (tests/service)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
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

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_RAY_LOCK_HELD = "GDNVAL_TESTS_RAY_LOCK_HELD"


@pytest.fixture(scope="module", autouse=True)
def one_ray_module_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """The Ray test modules (tests/workers/test_ray_*.py) each start local Ray clusters, and Ray's
    state API and `ray.init()` find the newest cluster on the machine: under pytest-xdist (`-n 2`)
    a module waits for the other worker's Ray module to end (an exclusive lock on a file). A
    pytest run that a holder starts (test_ray_range's, at Ray's lower bound) runs under its lock."""
    if not request.path.name.startswith("test_ray_") or os.environ.get(_RAY_LOCK_HELD):
        yield
        return
    import fcntl

    with open(Path(tempfile.gettempdir()) / "gdnval-tests-ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.environ[_RAY_LOCK_HELD] = "1"
        try:
            yield
        finally:
            del os.environ[_RAY_LOCK_HELD]


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
