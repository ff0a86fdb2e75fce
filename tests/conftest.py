"""Test-wide setup. Without a GPU, Triton kernels run under its CPU interpreter."""

from __future__ import annotations

import os
import shutil

import pytest

if shutil.which("nvidia-smi") is None:
    # Must be set before anything imports triton; GPU machines run the compiled kernels.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
