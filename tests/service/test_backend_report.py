"""The backend of every sample on the pages and in the report, from a real gdn-op quick run.

`gdnval run gdn-op` runs two backends here on the CPU, `eager` and a one-off `module:function`
backend (the per-token oracle, which keeps the protocol and carries autograd), both timed, on a
plain and a packed shape, with the one-off backend as the job's `baseline` (not eager); the run
is stored as two jobs of the store. Then:
- `gdnval report` puts the backends side by side, one row per shape, a column group per backend,
  each cell a stored number (the speed-up over the baseline's same shape with its interval, the
  worst tensor's rel-L2), and
  names where each backend's code came from; its speed table's speed-up column is against the job's
  baseline backend and says so in its header;
- the job page labels every table row and case with its backend and lists the backends' sources,
  and its speed-ups are against the job's baseline backend;
- the compare page labels every case with its backend.
"""

from __future__ import annotations

import json
import re
import statistics
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from service.app import create_app
from service.persistence import db
from service.presentation.numbers import fmt
from service.settings import Settings
from tests.support.run_json import store_run

ONE_OFF = "gdn.reference:recurrent_gated_delta_rule"
BACKENDS = ("eager", ONE_OFF)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from service.cli import main

    tmp = tmp_path_factory.mktemp("backend-report")
    run = tmp / "run.json"
    params = {"backends": list(BACKENDS), "baseline": ONE_OFF, "timed_backends": None, "modes": ["stateful"],
              "packed": [[1, 63, 65]], "warmup": 1, "repeat": 3, "eager_warmup": 1, "eager_repeat": 3}
    args = ["run", "gdn-op", "--preset", "quick", "--json", str(run)]
    args += [x for k, v in params.items() for x in ("--param", f"{k}={json.dumps(v)}")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    url = f"sqlite:///{tmp / 'store.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    base = store_run(engine, run)
    head = store_run(engine, run)
    engine.dispose()
    return {"url": url, "base": base, "head": head, "doc": json.loads(run.read_text()), "tmp": tmp}


def _medians(doc: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(case, metric) -> the median of the worst rank per idx (one rank here: of the values)."""
    vals: dict[tuple[str, str], list[float]] = {}
    for s in doc["samples"]:
        vals.setdefault((s["case"], s["metric"]), []).append(s["value"])
    return {k: statistics.median(v) for k, v in vals.items()}


def _section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_report_puts_the_backends_side_by_side(stored: dict[str, Any]) -> None:
    from service.cli import main

    out = stored["tmp"] / "report.md"
    res = CliRunner().invoke(main, ["report", str(stored["head"]), "--db", stored["url"], "--out", str(out)])
    assert res.exit_code == 0, res.output
    md = out.read_text()
    doc, med = stored["doc"], _medians(stored["doc"])
    cases = {c["name"]: c for c in doc["cases"]}
    assert len(cases) == 4 and {c["params"]["backend"] for c in cases.values()} == set(BACKENDS)

    sources = _section(md, "Environment").split("### Backends under test\n", 1)[1]
    for b in BACKENDS:
        assert re.search(rf"\| `{re.escape(b)}` \| gdnval \| ", sources), sources

    table = [ln for ln in _section(md, "Backends side by side").splitlines() if ln.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[:2] == ["T", "packed"]
    for b in BACKENDS:  # a column group per backend, in the job's order
        want = [f"{b}: fwd+bwd", f"{b}: speed-up vs {ONE_OFF}", f"{b}: worst rel-L2"]
        assert [h for h in header if h.startswith(f"{b}: ")] == want
    rows = [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")), strict=True)) for ln in table[2:]]
    assert [r["T"].split("]")[0].lstrip("[") for r in rows] == ["65", "129"]  # one row per shape
    for row in rows:
        by_backend = {c["params"]["backend"]: name for name, c in cases.items()
                      if str(c["params"]["seq_len"]) in row["T"]}
        for b, name in by_backend.items():
            assert row[f"{b}: fwd+bwd"] == fmt(med[(name, "fwd_bwd_ms")], "ms")
            worst = max((v, m.removesuffix("_rel_l2")) for (c, m), v in med.items()
                        if c == name and m.endswith("_rel_l2"))
            assert row[f"{b}: worst rel-L2"] == f"{fmt(worst[0])} ({worst[1]})"
        assert row[f"{ONE_OFF}: speed-up vs {ONE_OFF}"] == "1 (baseline)"
        # the baseline's median fwd+bwd over this one's, same shape, with the repetitions' interval
        speedup = med[(by_backend[ONE_OFF], "fwd_bwd_ms")] / med[(by_backend["eager"], "fwd_bwd_ms")]
        assert _point(row[f"eager: speed-up vs {ONE_OFF}"]) == f"{speedup:.3g}×"

    # Speed and memory: the speed-up of each row over the same shape on the job's baseline backend
    speed = [ln for ln in _section(md, "Speed and memory").splitlines() if ln.startswith("|")]
    header = [c.strip() for c in speed[0].strip("|").split("|")]
    assert header[-1] == f"speed-up vs {ONE_OFF}" and not any("eager" in h for h in header), header
    rows = [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")), strict=True)) for ln in speed[2:]]
    assert len(rows) == 4
    for row in rows:
        backend = row["backend"].split("]")[0].lstrip("[")
        name = next(n for n, c in cases.items() if c["params"]["backend"] == backend
                    and str(c["params"]["seq_len"]) == row["T"])
        if backend == ONE_OFF:
            assert row[header[-1]] == "–"  # the baseline itself
            continue
        base = next(n for n, c in cases.items() if c["params"]["backend"] == ONE_OFF
                    and c["params"]["seq_len"] == cases[name]["params"]["seq_len"])
        assert _point(row[header[-1]]) == f"{med[(base, 'fwd_bwd_ms')] / med[(name, 'fwd_bwd_ms')]:.3g}×"


def _point(cell: str) -> str:
    """'~ 8.55× [8.03, 12.7]' -> '8.55×': the point value before its interval."""
    assert re.fullmatch(r"(~ )?\S+ \[\S+, \S+\]", cell), cell
    return cell.removeprefix("~ ").split(" [")[0]


def test_the_pages_label_every_row_with_its_backend(stored: dict[str, Any]) -> None:
    backend_of = {c["name"]: c["params"]["backend"] for c in stored["doc"]["cases"]}
    settings = Settings(db_url=stored["url"], dispatch=False, executor="local")
    with TestClient(create_app(settings)) as client:
        job = client.get(f"/jobs/{stored['head']}")
        cmp = client.get("/compare", params={"base": stored["base"], "head": stored["head"], "show": "all"})
    assert job.status_code == 200 and cmp.status_code == 200, (job.text[-500:], cmp.text[-500:])

    listed = re.search(r'<dd id="job-backends">(.*?)</dd>', job.text, re.S)
    assert listed is not None and all(f"<code>{b}</code>" in listed.group(1) for b in BACKENDS)
    assert "<dt>backends</dt>" not in job.text.split('id="job-backends"')[1]  # not again as raw JSON
    # every table row that starts a case, and every case section, names the case's backend
    tag = r'<a href="#case-[0-9a-f]+">([^<]+)</a> <span class="backend-tag" data-backend="([^"]+)"'
    labelled = re.findall(tag, job.text)
    tables = job.text.split('<h2 id="cases">')[0]
    assert len(re.findall(r'<a href="#case-', tables)) == len(re.findall(tag, tables)) > 0
    assert {(case, b) for case, b in labelled} == set(backend_of.items())
    for name, b in backend_of.items():
        heading = rf'<h3 id="h-[0-9a-f]+">{re.escape(name)} .*?data-backend="{re.escape(b)}"'
        assert re.search(heading, job.text)

    # the speed table's speed-ups: every eager row against the same shape on the job's baseline
    speed = job.text.split('id="speed-table"', 1)[1].split("</table>", 1)[0]
    against = re.findall(r'<td class="hide-narrow small">([^<]*)</td>', speed)
    eager_cases = sorted(n for n, b in backend_of.items() if b == "eager")
    assert {a for a in against if a} == {f"vs {ONE_OFF} ({n.replace('_eager', '_' + ONE_OFF)})"
                                         for n in eager_cases}, against

    cells = re.findall(r'<td rowspan="\d+" class="casecell"><strong>([^<]+)</strong> '
                       r'<span class="backend-tag" data-backend="([^"]+)"', cmp.text)
    assert sorted(cells) == sorted(backend_of.items())
