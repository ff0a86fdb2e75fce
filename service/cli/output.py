"""How the CLI writes its results: tables that keep every character when piped, and JSON that
strict parsers accept.

- `console()`: a rich Console; on a terminal it wraps to the terminal's width, elsewhere (a pipe,
  a file, CI logs) it never truncates or folds a cell, so `gdnval jobs | grep` sees whole names.
- `strict_json(value)`: the value with every NaN and ±Infinity replaced by null, plus the JSON
  pointers of what was replaced, so the writer can say so (e.g. a `"nonfinite": [...]` key):
  JSON has no NaN, and `json.dumps`' default `NaN` breaks strict parsers (jq reads it as null or
  1.797e308 without a word).
- `dumps(value)`: `strict_json` then `json.dumps(..., allow_nan=False)`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from typing import IO, Any

PIPE_WIDTH = 100_000  # columns a table may use when nobody's terminal limits it


def console(file: IO[str] | None = None) -> Any:
    """A rich Console for `file` (default stdout) that truncates nothing unless it is a terminal."""
    from rich.console import Console

    out = file or sys.stdout
    if out.isatty():
        return Console(file=out)
    return Console(file=out, width=PIPE_WIDTH, no_color=True, soft_wrap=True)


def _pointer(parts: list[str]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def strict_json(value: Any) -> tuple[Any, list[str]]:
    """(`value` with NaN/±Infinity as None, JSON pointers of the replaced numbers)."""
    replaced: list[str] = []

    def walk(v: Any, path: list[str]) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            replaced.append(_pointer(path))
            return None
        if isinstance(v, Mapping):
            return {k: walk(x, [*path, str(k)]) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x, [*path, str(i)]) for i, x in enumerate(v)]
        return v

    return walk(value, []), replaced


def dumps(value: Any, *, indent: int | None = 1) -> str:
    """Strict JSON text of `value` (non-finite numbers as null; see `strict_json`)."""
    clean, _ = strict_json(value)
    return json.dumps(clean, indent=indent, allow_nan=False)
