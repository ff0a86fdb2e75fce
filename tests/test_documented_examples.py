"""Python examples in docs/ that show what they print (a ```python block, then 'printed' and the
output block) are run here as written, and must print exactly that."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = r"(?:(?!```).)*"  # a fenced block's text: anything up to the next fence
EXAMPLE = re.compile(rf"```python\n(?P<code>{BLOCK})```\s*\nprinted\s*\n\s*```\n(?P<out>{BLOCK})```", re.S)


def examples() -> list[tuple[str, str, str]]:
    out = []
    for doc in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]):
        for i, m in enumerate(EXAMPLE.finditer(doc.read_text())):
            out.append((f"{doc.relative_to(ROOT)}#{i}", m["code"], m["out"]))
    return out


def test_the_docs_show_examples() -> None:
    assert any(name.startswith("docs/howto-metric.md") for name, _, _ in examples())


@pytest.mark.parametrize(("name", "code", "printed"), examples(), ids=[e[0] for e in examples()])
def test_a_documented_example_prints_what_the_doc_says(name: str, code: str, printed: str) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, name, "exec"), {"__name__": "__doc_example__"})
    assert buf.getvalue() == printed, buf.getvalue()
