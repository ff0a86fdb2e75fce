"""The report as Markdown a pull request comment shows without sideways scrolling.

Paragraphs and list items are wrapped at `LINE` characters (Markdown joins the lines again);
a table wider than `report_model.MAX_COLUMNS` is split into parts that repeat its key columns,
and a table of more than `FOLD_ROWS` rows is folded into a `<details>` block (GitHub and GitLab
render the Markdown inside it). Cells carry no Markdown of their own: a link or code style is
written here, from the cell's fields.
"""

from __future__ import annotations

import textwrap

from service.presentation.report_model import Cell, Report, Section, Table

LINE = 100  # characters per line of prose
FOLD_ROWS = 12  # a longer table is folded (its summary names it and its row count)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def cell_markdown(c: Cell) -> str:
    """A cell as Markdown: code in backticks, a link around the text, '–' for an empty one."""
    text = _escape(c.text) or "–"
    if c.code:
        text = f"`{text}`"
    return f"[{text}]({c.href})" if c.href else text


def table_markdown(t: Table) -> list[str]:
    out = [
        "| " + " | ".join(_escape(h) for h in t.header) + " |",
        "|" + "|".join("---" for _ in t.header) + "|",
    ]
    out += ["| " + " | ".join(cell_markdown(c) for c in row) + " |" for row in t.rows]
    return out


def _wrap(text: str, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(
        text,
        LINE,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def _table_block(t: Table, title: str) -> list[str]:
    lines: list[str] = []
    for part in t.parts():
        body = table_markdown(part)
        if len(part.rows) > FOLD_ROWS:
            columns = part.header[part.keys :] or part.header
            summary = f"{title}: {len(part.rows)} rows ({', '.join(columns)})"
            lines += ["<details>", f"<summary>{_escape(summary)}</summary>", "", *body, "", "</details>", ""]
        else:
            lines += [*body, ""]
    return lines


def section_markdown(s: Section) -> list[str]:
    lines = [f"## {s.title}", ""]
    for block in s.blocks:
        if isinstance(block, Table):
            if lines[-1] != "":
                lines.append("")
            lines += _table_block(block, s.title)
        elif block.startswith("- "):
            lines += _wrap(block[2:], "- ", "  ")
        else:
            if lines[-1] != "":
                lines.append("")
            lines += [*_wrap(block), ""]
    if lines[-1] != "":
        lines.append("")
    return lines


def render(report: Report) -> str:
    """Markdown: the title, the header notes, then each section's heading, paragraphs and tables."""
    lines = [f"# {report.title}", ""]
    for note in report.notes:
        lines += [*_wrap(note), ""]
    for s in report.sections:
        lines += section_markdown(s)
    return "\n".join(lines).rstrip() + "\n"
