"""The commands shown in README.md, CONTRIBUTING.md, docs/*.md and docs/decisions/*.md, as a reader
would copy them.

A command is a line of a fenced `bash`/`sh`/`shell` block (backslash continuations joined, a
trailing comment dropped) or an inline code span that starts with a program this project ships or
calls (`gdnval`, `python`, `bash`, ...). A *synopsis* (`gdnval run SUITE [--preset P]`) is a
command shape with placeholders rather than a command to paste; it is recognised by its brackets,
bars, ellipses or upper-case placeholders.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import ROOT

DOC_FILES = ("README.md", "CONTRIBUTING.md", "docs/*.md", "docs/decisions/*.md")
SHELLS = ("bash", "sh", "shell")
# Programs whose inline spans are commands; `gdnval.db` or a bare `python` are not.
HEADS = ("gdnval", ".venv/bin/gdnval", "python", "python3", ".venv/bin/python", "bash",
         "docker", "ray", "pip", "curl")
WRAPPERS = {"/usr/bin/time": 0, "time": 0, "timeout": 1, "setsid": 0}  # name -> positional args
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.\.\.)?$|^<.*>$|\.\.\.$")
_FENCE = re.compile(r"^```(\w*)\s*$")
_SPAN = re.compile(r"`([^`\n]+)`")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class DocCommand:
    """One command as documented: where it is and its text."""

    path: str
    line: int
    text: str

    @property
    def synopsis(self) -> bool:
        """A command shape with placeholders, not a command to paste."""
        if any(t in self.text for t in ("[", "\\|", "...")):
            return True
        return any(PLACEHOLDER.search(w) for cmd in simple_commands(self.text) for w in cmd[1:])

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def doc_paths() -> list[Path]:
    out: list[Path] = []
    for pattern in DOC_FILES:
        out.extend(sorted(ROOT.glob(pattern)))
    return out


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a `#` inside quotes stays)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=False)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        words = list(lex)
    except ValueError:
        return line.strip()
    if not words:
        return ""
    # Cut the raw text after the last kept word so quoting stays as written.
    cut = line.find(" #")
    while cut != -1:
        try:
            if shlex.split(line[:cut]) == words:
                return line[:cut].rstrip()
        except ValueError:
            pass
        cut = line.find(" #", cut + 1)
    return line.strip()


def _fenced(path: Path, text: str) -> Iterator[DocCommand]:
    lang: str | None = None
    pending, start = "", 0
    for no, raw in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(raw.strip())
        if fence:
            lang = None if lang is not None else fence.group(1)
            continue
        if lang not in SHELLS:
            continue
        if not pending:
            start = no
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = _strip_comment(pending + raw)
        pending = ""
        if line and not line.startswith("#"):
            yield DocCommand(str(path.relative_to(ROOT)), start, " ".join(line.split()))


def _inline(path: Path, text: str) -> Iterator[DocCommand]:
    in_fence = False
    for no, raw in enumerate(text.splitlines(), 1):
        if _FENCE.match(raw.strip()):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for span in _SPAN.findall(raw):
            words = span.split()
            while words and _ASSIGN.match(words[0]):
                words = words[1:]
            if len(words) >= 2 and words[0] in HEADS:
                yield DocCommand(str(path.relative_to(ROOT)), no, span.strip())


def documented_commands() -> list[DocCommand]:
    out: list[DocCommand] = []
    for path in doc_paths():
        text = path.read_text()
        out.extend(_fenced(path, text))
        out.extend(_inline(path, text))
    return out


def simple_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell line (split at `&&`, `||`, `;`, `|`), each without leading
    variable assignments and wrappers such as `/usr/bin/time -v`."""
    lex = shlex.shlex(text.replace("\\|", "|"), posix=True, punctuation_chars="&|;")
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:
        tokens = text.split()
    cmds: list[list[str]] = [[]]
    for tok in tokens:
        if tok in ("&&", "||", ";", "|", "&"):
            cmds.append([])
        else:
            cmds[-1].append(tok)
    out = []
    for cmd in cmds:
        while cmd and _ASSIGN.match(cmd[0]):
            cmd = cmd[1:]
        while cmd and cmd[0] in WRAPPERS:
            skip = WRAPPERS[cmd[0]]
            cmd = cmd[1:]
            while cmd and cmd[0].startswith("-"):
                cmd = cmd[1:]
            cmd = cmd[skip:]
        if cmd:
            out.append(cmd)
    return out
