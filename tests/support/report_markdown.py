"""Reading a report's Markdown back in tests: its `## ` sections, its tables as rows of cells (links
and code reduced to their text), a split table's parts joined, and the job and case each row links
to."""

from __future__ import annotations

import re


def sections(md: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", md, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def cells(ln: str) -> list[str]:
    return [
        re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", c.strip()).strip("`")
        for c in re.split(r"(?<!\\)\|", ln)[1:-1]
    ]


def tables(text: str) -> list[tuple[list[str], list[dict[str, str]]]]:
    """Every table of a section: its header and rows as dicts (links and code reduced to text)."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.splitlines() if ln.startswith("|")]
        if lines:
            header = cells(lines[0])
            out.append((header, [dict(zip(header, cells(ln), strict=True)) for ln in lines[2:]]))
    return out


def table(text: str, n: int = 0) -> tuple[list[str], list[dict[str, str]]]:
    """The n-th table of a section."""
    return tables(text)[n]


def joined(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """A section's split table, its parts joined row by row (the parts repeat the key columns)."""
    parts = tables(text)
    header = list(parts[0][0])
    rows = [dict(r) for r in parts[0][1]]
    for h, rs in parts[1:]:
        if len(rs) != len(rows):
            break
        header += [c for c in h if c not in header]
        for row, more in zip(rows, rs, strict=True):
            row.update(more)
    return header, rows


def linked(text: str) -> list[tuple[int, str]]:
    """(job id, case fingerprint) each row of a section's first table links to."""
    block = next(b for b in re.split(r"\n\s*\n", text) if b.lstrip().startswith("|"))
    out = []
    for ln in [ln for ln in block.splitlines() if ln.startswith("| ")][1:]:
        found = re.search(r"/jobs/(\d+)#case-([0-9a-f]+)\)", ln)
        assert found, ln
        out.append((int(found.group(1)), found.group(2)))
    return out


def linked_rows(text: str) -> list[tuple[tuple[int, str], dict[str, str]]]:
    """((job id, case fingerprint) its row links to, the row, its split parts joined) per row."""
    _, rows = joined(text)
    return list(zip(linked(text), rows, strict=True))
