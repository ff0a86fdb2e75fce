"""Fixtures of the gdn tests: the sample token file that the data, trajectory and network tests read."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gdn.data's built-in sample text as a token file, built once per test module."""
    from gdn.data import build_sample_token_file

    path = tmp_path_factory.mktemp("tokens") / "sample.bin"
    build_sample_token_file(path)
    return path
