"""The triton-ascend the NPU image installs is the one the lowering test compiles with and the
one docs/npu.md names beside the image's CANN: one pin, three places."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_triton_ascend_is_pinned_once() -> None:
    dockerfile = (ROOT / "docker/Dockerfile.npu").read_text()
    image = re.search(r"^ARG TRITON_ASCEND_VERSION=(\S+)$", dockerfile, re.M)
    bootstrap = (ROOT / "scripts/bootstrap.sh").read_text()
    boot = re.search(r"^TRITON_ASCEND=triton-ascend==(\S+)$", bootstrap, re.M)
    assert image and boot, "Dockerfile.npu's TRITON_ASCEND_VERSION or bootstrap.sh's TRITON_ASCEND is gone"
    assert image.group(1) == boot.group(1), (image.group(1), boot.group(1))
    cann = re.search(r"^ARG CANN_IMAGE=ascendai/cann:([0-9.A-Za-z]+)-", dockerfile, re.M)
    row = f"| triton-ascend | {image.group(1)} |"
    doc = (ROOT / "docs/npu.md").read_text()
    assert row in doc, f"docs/npu.md has no row starting {row!r}"
    assert cann and f"CANN {cann.group(1)}" in doc.split(row, 1)[1].splitlines()[0], "the row names its CANN"
