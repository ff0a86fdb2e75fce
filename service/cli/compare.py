"""`gdnval compare BASE HEAD`: two runs compared here, without a service.

Each side is a job of the results store (`--db`: a `gdnval run` is kept there) given by its id,
or a `gdnval run --json` file (stored for the comparison in a scratch store that is deleted
after). The compare engine judges them exactly as the compare page does, and the output is the
page's: both sides, the verdict, the case and metric counts, then the table of
`service.presentation.views.compare_rows` (`--show changes|regressions|all`).

Exit code (`service.domain.exit_codes`): 0 no regression, 1 a case regressed or failed, 2 the
two could not be compared (a side is missing, another suite, other hardware) or a time change is
beyond its minimum effect but not significant (undecided: measure again, or gate it).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import click

from service.cli.client import fail
from service.cli.local_store import db_option, open_store
from service.cli.output import console
from service.domain import exit_codes

EXIT_PASS, EXIT_FAIL, EXIT_UNDECIDED = exit_codes.PASSED, exit_codes.FAILED, exit_codes.COULD_NOT_RUN


def _is_file(side: str) -> bool:
    return not side.lstrip("#").isdigit()


class _Sides:
    """Loads each side from the store or from a run document, opening each store once."""

    def __init__(self, stack: ExitStack, db_url: str | None) -> None:
        self.stack, self.db_url = stack, db_url
        self.store: Any = None
        self.scratch: Any = None

    def load(self, side: str) -> Any:
        from sqlalchemy.orm import Session

        from service.domain.baselines import NotFound, load_side

        if _is_file(side):
            engine, job_id = self.scratch_store(), self._store_file(Path(side))
        else:
            if self.store is None:
                self.store = open_store(self.db_url)
                self.stack.callback(self.store.dispose)
            engine, job_id = self.store, int(side.lstrip("#"))
        try:
            with Session(engine) as s:
                return load_side(s, job_id)
        except NotFound as exc:
            fail(f"{exc} ({engine.url.render_as_string(hide_password=True)})")

    def scratch_store(self) -> Any:
        if self.scratch is None:
            folder = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="gdnval-compare-")))
            self.scratch = open_store(f"sqlite:///{folder / 'runs.db'}", create=True)
            self.stack.callback(self.scratch.dispose)
        return self.scratch

    def _store_file(self, path: Path) -> int:
        from pydantic import ValidationError

        from service.persistence.runs import RunDocument, store_run

        try:
            doc = RunDocument.model_validate(json.loads(path.read_text()))
        except OSError as exc:
            fail(f"{path}: neither a job id nor a readable run file ({exc.strerror or exc})")
        except (json.JSONDecodeError, ValidationError) as exc:
            fail(f"{path} is not a `gdnval run --json` document: {' '.join(str(exc).split())[:400]}")
        job, _ = store_run(self.scratch_store(), doc.model_copy(update={"run_id": ""}))
        return job.id


@contextmanager
def _sides(db_url: str | None) -> Iterator[_Sides]:
    with ExitStack() as stack:
        yield _Sides(stack, db_url)


def _label(side: str) -> str:
    return side if _is_file(side) else f"job #{side.lstrip('#')}"


def outcome(cmp: Any) -> int:
    """The exit code of a comparison (see the module's docstring)."""
    if not cmp.passed:
        return EXIT_FAIL
    undecided = any(c.verdict == "incomparable" or any(m.verdict == "inconclusive" for m in c.metrics)
                    for c in cmp.cases)
    return EXIT_UNDECIDED if undecided else EXIT_PASS


def render(out: Any, cmp: Any, show: str, labels: tuple[str, str]) -> None:
    """The compare page's content as text: the sides, the verdict, the counts, the table."""
    from rich.table import Table

    from service.presentation import views

    for label, ref in zip(labels, (cmp.base, cmp.head), strict=True):
        out.print(f"{label}: {ref.suite} {ref.preset} · {(ref.commit or 'installed')[:12]} · "
                  f"{ref.device} × {ref.world_size}", highlight=False)
    out.print(views.compare_verdict(cmp)[0], highlight=False)
    for what, counts in (("cases", cmp.counts()), ("metrics", cmp.metric_counts())):
        out.print(f"{what}: " + (", ".join(f"{n} {v}" for v, n in counts.items() if n) or "none"),
                  highlight=False)
    table = Table("case", "metric", "verdict", "base", "head", "delta", "ratio", "CI", "p", "why")
    for row in views.compare_rows(cmp, show):
        first = row.get("span") is not None
        table.add_row(row["case"] if first else "", row["metric"], row["verdict"], row["base"], row["head"],
                      row["delta"], row["ratio"], row["ci"], row["p"], row["reason"])
    out.print(table)


@click.command()
@click.argument("base")
@click.argument("head")
@db_option
@click.option("--show", default="changes", show_default=True,
              type=click.Choice(["changes", "regressions", "all"]),
              help="changes: metrics that moved; regressions: regressed or failed ones; all: every metric")
def compare(base: str, head: str, db_url: str | None, show: str) -> None:
    """Compare HEAD against BASE: each a job id of the store or a `gdnval run --json` file."""
    from service.domain.compare import compare as run_compare

    with _sides(db_url) as sides:
        base_side, head_side = sides.load(base), sides.load(head)
    if base_side.ref.suite != head_side.ref.suite:
        fail(f"{base} ran suite {base_side.ref.suite!r} but {head} ran {head_side.ref.suite!r}; "
             "compare two runs of one suite")
    cmp = run_compare(base_side, head_side)
    code = outcome(cmp)
    out = console()
    render(out, cmp, show, (f"base {_label(base)}", f"head {_label(head)}"))
    out.print(f"exit {code}", highlight=False)
    raise SystemExit(code)
