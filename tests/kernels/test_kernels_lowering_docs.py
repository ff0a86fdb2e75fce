"""docs/kernels.md and docs/npu.md say what the Ascend lowering test asserts: the lowering table
names exactly the kernels `tests/kernels/test_kernels_ascend.py` requires to lower, which are
every Triton kernel of `kernels/gdn`, and docs/npu.md names none as failing. No venv needed: this
reads the sources and the docs."""

from __future__ import annotations

import re
from pathlib import Path

from tests.kernels.test_kernels_ascend import LOWERS

ROOT = Path(__file__).resolve().parents[2]


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_the_lowering_table_names_the_kernels_the_test_lowers() -> None:
    table = _section(ROOT / "docs" / "kernels.md", "## Lowering for Ascend")
    rows = [line for line in table.splitlines() if line.startswith("| `_")]
    listed = {k for line in rows for k in re.findall(r"`(_\w+_kernel)`", line)}
    assert all(line.rstrip(" |").endswith("yes") for line in rows), rows
    assert listed == LOWERS, f"docs only: {sorted(listed - LOWERS)}, test only: {sorted(LOWERS - listed)}"


def test_every_kernel_of_the_package_is_lowered() -> None:
    defined = {m.group(1) for p in (ROOT / "kernels" / "gdn").glob("*.py")
               for m in re.finditer(r"^def (_\w+_kernel)\(", p.read_text(), re.M)}
    assert defined == LOWERS, f"not lowered: {sorted(defined - LOWERS)}, gone: {sorted(LOWERS - defined)}"


def test_npu_doc_names_no_kernel_as_not_lowering() -> None:
    proven = _section(ROOT / "docs" / "npu.md", "## What is proven where")
    assert "Every kernel lowers" in proven
    assert not re.search(r"[Nn]ot lowering|does not lower|fails to lower", proven), proven
