"""The backend of every sample on the pages and in the report, from a real gdn-op quick run.

`gdnval run gdn-op` runs two backends here on the CPU, `eager` and a one-off `module:function`
backend (the per-token oracle, which keeps the protocol and carries autograd), both timed, on a
plain and a packed shape, with the one-off backend as the job's `baseline` (not eager); the run
is stored as two jobs of the store. Then:
- `gdnval report` names where each backend's code came from, prints each backend's stored numbers
  per shape, and its speed-up column is against the job's baseline backend (judged on the
  repetitions) and says so in its header;
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


def _rows(text: str, n: int) -> list[dict[str, str]]:
    """The n-th table of a section as dicts of cell texts (links and code reduced to their text)."""
    block = [b.strip() for b in text.split("\n\n") if b.strip().startswith("|")][n].splitlines()

    def cells(ln: str) -> list[str]:
        unlinked = (re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", c.strip()) for c in ln.strip("|").split(" | "))
        return [c.strip("`") for c in unlinked]

    return [dict(zip(cells(block[0]), cells(ln), strict=True)) for ln in block[2:]]


def test_the_report_names_each_backend_and_its_baseline(stored: dict[str, Any]) -> None:
    from service.cli import main

    out = stored["tmp"] / "report.md"
    res = CliRunner().invoke(main, ["report", str(stored["head"]), "--db", stored["url"], "--out", str(out)])
    assert res.exit_code == 0, res.output
    md = out.read_text()
    doc, med = stored["doc"], _medians(stored["doc"])
    cases = {c["name"]: c for c in doc["cases"]}
    assert len(cases) == 4 and {c["params"]["backend"] for c in cases.values()} == set(BACKENDS)

    sources = _rows(_section(md, "Environment and backends"), 1)
    assert {(r["backend"], r["distribution"]) for r in sources} == {(b, "gdnval") for b in BACKENDS}

    accuracy = _rows(_section(md, "Single-device GDN accuracy"), 0)
    assert sorted((r["T"], r["backend"]) for r in accuracy) == sorted(
        (str(c["params"]["seq_len"]), c["params"]["backend"]) for c in cases.values())

    speed = _section(md, "Single-device GDN speed and memory")
    times, versus = _rows(speed, 0), _rows(speed, 1)
    assert f"speed-up = the {ONE_OFF} fwd+bwd over this one's" in " ".join(speed.split())
    for t, v in zip(times, versus, strict=True):
        name = next(n for n, c in cases.items() if c["params"]["backend"] == t["backend"]
                    and str(c["params"]["seq_len"]) == t["T"])
        assert t["fwd+bwd"] == f"{med[(name, 'fwd_bwd_ms')]:.3f}"
        if t["backend"] == ONE_OFF:
            assert v[f"speed-up vs {ONE_OFF}"] == "–"  # the baseline itself
        else:  # three repetitions per side can never be significant: no claim, the interval given
            assert v[f"speed-up vs {ONE_OFF}"].startswith("no significant difference (95% CI "), v
    assert "eager faster" not in md and "eager slower" not in md


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
