"""The report as plain data: the jobs it is built from, and what it is made of (cells, tables,
sections, plots, the sections that did not run).

Both renderers read this and only this: `service.presentation.report_markdown` writes the
Markdown a pull request author pastes, the report page (`service.web.routes.reports`) draws the
same blocks as HTML. A cell is text with an optional link or code style, never Markdown, so
neither renderer has to parse what the other writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np

EMPTY_CELLS = ("", "–")
# A table wider than this is split into parts that repeat its key columns: a pull request
# comment shows about eight columns of numbers without scrolling sideways.
MAX_COLUMNS = 8


@dataclass(frozen=True)
class Cell:
    """One table cell: plain text, optionally a link (`href`) or code (a commit, a file name)."""

    text: str
    href: str | None = None
    code: bool = False

    @property
    def empty(self) -> bool:
        return self.text.strip() in EMPTY_CELLS


def cell(value: Cell | str) -> Cell:
    return value if isinstance(value, Cell) else Cell(str(value))


@dataclass
class Table:
    """A table: `keys` leading columns name the row; a split table repeats them in each part."""

    header: list[str]
    rows: list[list[Cell]]
    keys: int = 1

    def __post_init__(self) -> None:
        self.rows = [[cell(c) for c in r] for r in self.rows]
        for r in self.rows:
            if len(r) != len(self.header):
                raise ValueError(
                    f"a row of {len(r)} cells under the header {self.header}; expected "
                    f"{len(self.header)} cells"
                )

    def without_empty_columns(self) -> Table:
        """The table without the columns no row has a value in (a gain against Ulysses in a
        campaign without Ulysses); the key columns always stay."""
        keep = [i for i in range(len(self.header)) if i < self.keys or any(not r[i].empty for r in self.rows)]
        return Table(
            [self.header[i] for i in keep],
            [[r[i] for i in keep] for r in self.rows],
            min(self.keys, len(keep)),
        )

    def parts(self, max_columns: int = MAX_COLUMNS) -> list[Table]:
        """The table as parts of at most `max_columns` columns, each with the key columns and an
        even share of the others; the table itself when it fits."""
        if len(self.header) <= max_columns or self.keys >= max_columns:
            return [self]
        values = list(range(self.keys, len(self.header)))
        n = math.ceil(len(values) / (max_columns - self.keys))
        size = math.ceil(len(values) / n)
        out = []
        for k in range(n):
            cols = [*range(self.keys), *values[k * size : (k + 1) * size]]
            out.append(
                Table([self.header[i] for i in cols], [[r[i] for i in cols] for r in self.rows], self.keys)
            )
        return out


Block = str | Table  # a paragraph (plain text) or a table; "- " starts a list item


@dataclass
class Section:
    """One concern of the report: a title and blocks, in order."""

    key: str
    title: str
    blocks: list[Block] = field(default_factory=list)


@dataclass(frozen=True)
class NotRun:
    """A section the report has no data for, and why (one line in the report)."""

    title: str
    why: str


@dataclass
class SweepSeries:
    """One line of a sweep: a statistic (and its spread) at each size."""

    name: str
    sizes: list[float]
    values: list[float]
    lo: list[float] | None = None
    hi: list[float] | None = None


@dataclass
class Sweep:
    """A quantity against a size (sequence length, world size, layers), one series per mode."""

    key: str
    title: str
    x_label: str
    unit: str
    series: list[SweepSeries]


@dataclass
class StepSeries:
    """One per-step line (a trajectory's relative difference), with its bound."""

    name: str
    steps: np.ndarray
    values: np.ndarray
    bound: float | None = None


@dataclass
class StepPlot:
    """A quantity per optimizer step, every case of the report overlaid."""

    key: str
    title: str
    unit: str
    series: list[StepSeries]


Plot = Sweep | StepPlot


@dataclass(frozen=True)
class Links:
    """Links into the pages: under a public base URL, relative (`base=""`: the report page of
    this service) or none at all (`base=None`)."""

    base: str | None = None

    def job(self, job_id: int) -> str | None:
        return None if self.base is None else f"{self.base}/jobs/{job_id}"

    def case(self, job_id: int, fingerprint: str) -> str | None:
        return None if self.base is None else f"{self.base}/jobs/{job_id}#case-{fingerprint}"

    def artifact(self, job_id: int, name: str) -> str | None:
        if self.base is None:
            return None
        return f"{self.base}/api/v1/jobs/{job_id}/artifacts/{quote(name, safe='/')}"


@dataclass
class JobData:
    """What the report needs of one job's record (read from the store by `report_load`)."""

    job_id: int
    suite: str
    preset: str
    status: str
    commit: str | None
    device: str
    world_size: int
    error: str | None
    info: Mapping[str, Any]
    cases: list[Any]  # summary_store.CaseSummary (fits service.presentation.views.CaseStats)
    started: Any = None
    finished: Any = None
    verdict: str | None = None  # the stored job verdict (workers.verdict.job_verdict)
    our_commit: str | None = None  # our code's commit (`commit` is the backend's when it runs one)


@dataclass
class ReportJob:
    """One job of the report: its record and case summaries, its artifact names, and its values
    per (case fingerprint, metric) after the worst-rank reduction, ordered by idx (one per
    repetition, step or seed): what every comparison in the report is judged on."""

    data: JobData
    artifacts: list[str] = field(default_factory=list)
    series: Mapping[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def job_id(self) -> int:
        return self.data.job_id

    @property
    def suite(self) -> str:
        return self.data.suite

    @property
    def world_size(self) -> int:
        return self.data.world_size

    @property
    def device(self) -> str:
        return self.data.device

    def values(self, fingerprint: str, metric: str) -> np.ndarray:
        """The rank-reduced values of one case's metric (empty when it has none)."""
        found = self.series.get((fingerprint, metric))
        return np.empty(0) if found is None else found[1]

    def steps(self, fingerprint: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(idx, value) of one case's metric: the steps of a trajectory."""
        return self.series.get((fingerprint, metric), (np.empty(0, dtype=np.int64), np.empty(0)))


@dataclass
class SuiteInput:
    """What a suite's report code gets: its suite name, every job of the report (a section may
    read another suite's jobs, as the network's reads the layer's saving) and the links."""

    suite: str
    jobs: Sequence[ReportJob]
    links: Links

    @property
    def mine(self) -> list[ReportJob]:
        return self.of(self.suite)

    def of(self, suite: str) -> list[ReportJob]:
        return [j for j in self.jobs if j.suite == suite]


@dataclass
class SuiteReport:
    """A suite's part of the report: its sections, plots, conclusion lines, and the sections it
    could not produce from these jobs with the reason."""

    sections: list[Section] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    conclusions: list[str] = field(default_factory=list)
    not_run: list[NotRun] = field(default_factory=list)

    def add(self, found: Section | NotRun | None) -> None:
        if isinstance(found, Section):
            self.sections.append(found)
        elif isinstance(found, NotRun):
            self.not_run.append(found)


@dataclass
class Report:
    """The whole report: its title, header notes (CPU timing), sections and plots."""

    title: str
    notes: list[str]
    sections: list[Section]
    plots: list[Plot] = field(default_factory=list)
