"""The CPU plan as a campaign through a real server (`gdnval serve`, local executor, gloo ranks) at
world sizes 4 and 8, driven by the commands docs/campaigns.md documents, run as written: every
job passes, Ulysses runs and passes at CP4 and CP8, and the API, the report and the pages show it:
the report's cross-run sections (weak scaling of the layer and the network, the per-layer model,
20-pass stability, a line for each section that could not run), no placeholder and no loopback
link in the campaign's report or in the job-set report of its two layer jobs, and its page in
chromium at 1400 px with no raw Markdown and no column cut off.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.api_support import ROOT, TOKEN, Server, make_server
from tests.support.browser import chromium_page, clipped_tables, shot
from tests.support.cli import gdnval as run_gdnval
from tests.support.report_markdown import sections

pytestmark = pytest.mark.slow  # a real server and twelve jobs on up to eight CPU ranks

DOC = ROOT / "docs" / "campaigns.md"
# the model-level suites whose Ulysses cases the tiny 8-head model makes run at CP4 and CP8
ULYSSES_SUITES = ("cp-layer", "network", "stability", "profile")


def documented_commands() -> list[str]:
    """The `gdnval campaign ...` lines of the doc's first code block that has them (its
    "A campaign" section: submit, show, report), in order."""
    blocks = re.findall(r"^```(?:bash)?\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    lines = ([ln for ln in b.splitlines() if ln.startswith("gdnval campaign ")] for b in blocks)
    return next((found for found in lines if found), [])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("campaign")
    srv = make_server(workdir, executor="local", GDNVAL_POLL_INTERVAL_S="0.2")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def gdnval(command: str, server: Server, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """`command` as the doc writes it, through this interpreter's `gdnval` entry point."""
    argv = shlex.split(command)
    assert argv[0] == "gdnval"
    env = {**os.environ, "GDNVAL_SERVER": server.base, "GDNVAL_API_TOKEN": TOKEN}
    return run_gdnval(*argv[1:], env=env, cwd=cwd, timeout=timeout)


@pytest.mark.timeout(2400)  # twelve jobs one after another; minutes on a shared 2-core machine
def test_cpu_plan_campaign_at_cp4_and_cp8(server: Server, tmp_path: Path) -> None:
    submit, show, report = documented_commands()
    assert "--plan pr-report-cpu" in submit and "--world-sizes 4,8" in submit and "--wait" in submit

    start = time.monotonic()
    done = gdnval(submit, server, tmp_path, timeout=2200)
    minutes = (time.monotonic() - start) / 60
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:] + server.log_text()
    assert re.search(r"^campaign 1 (queued|running): 12 jobs", done.stdout, flags=re.M), done.stdout
    assert re.search(r"12/12 jobs ended; profile@8 \(job \d+\): passed", done.stdout), done.stdout
    print(f"CPU campaign at world sizes 4 and 8: {minutes:.1f} min")

    with httpx.Client(base_url=server.base, timeout=30) as http:
        c = http.get("/api/v1/campaigns/1").json()
        assert (c["status"], c["verdict"], c["done"], c["total"]) == ("succeeded", "passed", 12, 12)
        assert c["plan"] == "pr-report-cpu" and c["world_sizes"] == [4, 8]
        jobs = {j["key"]: j["job"] for j in c["jobs"]}
        assert all((j["status"], j["verdict"]) == ("succeeded", "passed") for j in jobs.values())
        at4, at8 = ({k.split("@")[0] for k in jobs if k.endswith(f"@{n}")} for n in (4, 8))
        assert at4 == at8 == {"cp-layer", "network-4l", "network-8l", "stability", "profile"}
        for key, job in jobs.items():
            if job["suite"] not in ULYSSES_SUITES:
                continue
            cases = http.get(f"/api/v1/jobs/{job['id']}/cases").json()["items"]
            ulysses = [x for x in cases if "ulysses" in x["name"]]
            assert ulysses, f"{key}: no Ulysses case"
            statuses = {x["name"]: x["status"] for x in ulysses}
            assert set(statuses.values()) == {"passed"}, (key, statuses)
            assert job["world_size"] in (4, 8)

        md = http.get("/api/v1/campaigns/1/report.md")
        assert md.status_code == 200 and md.headers["content-type"].startswith("text/markdown")
        assert md.text.startswith("#") and "network" in md.text and "cp-layer" in md.text

        listing = http.get("/campaigns")
        assert listing.status_code == 200 and 'href="/campaigns/1"' in listing.text
        page = http.get("/campaigns/1")
        assert page.status_code == 200
        assert all(f'href="/jobs/{j["id"]}"' in page.text for j in jobs.values())
        assert page.text.count("v-unchanged") >= 13  # the campaign's verdict and each job's: passed

    report_sections(md.text)
    layers = f"{jobs['cp-layer@4']['id']} {jobs['cp-layer@8']['id']}"
    pair = gdnval(f"gdnval report {layers} --server {server.base}", server, tmp_path, timeout=120)
    assert pair.returncode == 0, pair.stdout + pair.stderr
    assert "## CP weak scaling" in pair.stdout and "# gdnval test report: cp-layer @ " in pair.stdout
    assert not re.search(r"_No |\]\(http://(127\.0\.0\.1|localhost)", pair.stdout), pair.stdout
    report_page(server, page.text)

    shown = gdnval(show, server, tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "verdict passed (12/12 jobs ended)" in shown.stdout
    assert re.search(r"network-4l@8\s+job \d+\s+succeeded\s+passed", shown.stdout), shown.stdout

    written = gdnval(report, server, tmp_path, timeout=120)
    assert written.returncode == 0, written.stdout + written.stderr
    out = tmp_path / "report.md"
    assert out.read_text() == md.text and written.stdout.startswith("wrote report.md")


def report_sections(md: str) -> None:
    """The campaign report's cross-run analysis and its honesty about what did not run."""
    got = sections(md)
    for title in ("CP weak scaling", "Network weak scaling", "Network per-layer model", "Stability",
                  "Profile traces", "Not run", "Conclusions"):
        assert got.get(title, "").strip(), (title, list(got))
    assert "| CP4 → CP8 | 16 |" in got["CP weak scaling"]  # local 16: 64 tokens at CP4, 128 at CP8
    assert re.search(r"\| 4 \| CP4 → CP8 \| 16 \|", got["Network weak scaling"])
    assert re.search(r"\| CP[48] \| \d+/16 \| (ulysses|p2p) \| 4 → 8 \|", got["Network per-layer model"])
    passes = re.findall(r"^\| CP[48] \| [^|]+ \| (\d+) \|", got["Stability"], flags=re.M)
    assert passes and set(passes) == {"20"}, got["Stability"]
    assert re.search(r"^- [^:]+: .+\.$", got["Not run"], flags=re.M), got["Not run"]
    assert "come from CPU ranks" in md.split("## ")[0] and "tiny" not in md
    assert "_No" not in md and not re.search(r"https?://(127\.0\.0\.1|localhost)", md)


def report_page(server: Server, campaign_page: str) -> None:
    """The campaign's report page, as a reader sees it at 1400 px: cells as HTML (no backticks or
    [text](link) left over), every table within its box, plots drawn."""
    found = re.search(r'href="(/reports/campaign\?[^"]+)"', campaign_page)
    assert found, "the campaign page links its report"
    with chromium_page(1400) as pg:
        pg.goto(server.base + found.group(1).replace("&amp;", "&"))
        pg.wait_for_selector("#report-conclusions")
        text = pg.inner_text("main")
        assert "`" not in text and not re.search(r"\]\(|\*\*", text), "raw Markdown on the page"
        assert not clipped_tables(pg), clipped_tables(pg)
        assert pg.locator("figure.plot svg").count() >= 3 and pg.locator("code").count() > 0
        print(f"report page screenshot: {shot(pg, 'campaign-report-1400')}")
