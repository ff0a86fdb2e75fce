"""Where the checkout is, for tests that read its files or start processes in it: one place, so a
test module can move between folders without counting its parents."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"  # runs kept as inputs of the report and table tests
