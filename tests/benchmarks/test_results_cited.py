"""`benchmarks/results/` keeps exactly the raw files the docs cite: every file a doc names under
`benchmarks/results/` exists, and every file there is named by some doc (README.md, CONTRIBUTING.md,
docs/ and docs/decisions/) or read by a test as its fixture. A doc may name a file by its path or,
after the path, by its name alone, and a set of files as `name_{a,b}.json`."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
NAME = re.compile(r"[\w.{},-]+\.(?:json|log)")


def expand(pattern: str) -> list[str]:
    """`a_{x,y}_b.json` -> [a_x_b.json, a_y_b.json] (any number of brace groups)."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def named(docs: list[Path] = DOCS) -> dict[str, set[str]]:
    """Every file name `docs` mention -> the files mentioning it; paths under benchmarks/results/
    keep their prefix (so that the first check can tell them apart)."""
    out: dict[str, set[str]] = {}
    for doc in docs:
        text = doc.read_text()
        for m in re.finditer(r"(benchmarks/results/)?(" + NAME.pattern + ")", text):
            for name in expand(m.group(2)):
                out.setdefault((m.group(1) or "") + name, set()).add(str(doc.relative_to(ROOT)))
    return out


def test_every_cited_result_exists() -> None:
    cited = {n: docs for n, docs in named().items() if n.startswith("benchmarks/results/")}
    missing = {n: sorted(d) for n, d in cited.items() if not (ROOT / n).exists()}
    assert cited and not missing, f"cited but not in benchmarks/results/: {missing}"


def test_every_result_is_cited() -> None:
    fixtures = named(sorted((ROOT / "tests").rglob("*.py")))
    names = {n.removeprefix("benchmarks/results/") for n in [*named(), *fixtures]}
    files = sorted(p.name for p in RESULTS.iterdir() if p.is_file())
    uncited = [f for f in files if f not in names]
    assert files and not uncited, f"in benchmarks/results/ but cited by no doc: {uncited}"


def test_brace_sets_expand() -> None:
    assert expand("gdn_{a,b}_h200{,_fla}.json") == ["gdn_a_h200.json", "gdn_a_h200_fla.json",
                                                    "gdn_b_h200.json", "gdn_b_h200_fla.json"]
