"""A burst of reads never hurts a running job: against a real server (uvicorn subprocess, loopback
only) while a real CPU job (capability, quick, on the local executor) and a fake job that writes
samples in small batches run, 300 concurrent reads of the job list, a job page and a job are
answered 200 or 503 with Retry-After (never 500), `/healthz` keeps answering within a second,
and both jobs succeed with every sample stored. Prints the figures recorded in
docs/operations.md."""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.api_support import FAKE, TOKEN, make_server
from tests.support.stores import STORES, store_url

pytestmark = pytest.mark.slow
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READS = 300
FAKE_PARAMS = {"cases": 3, "samples": 100, "batch": 10, "pause_s": 0.25}  # 60 batches, ~15 s


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def burst_in_process(base: str, urls: list[str]) -> list[tuple[int, str | None, float]]:
    """The burst from a process of its own: the prober's timings are the server's, not this
    process's (one interpreter running 300 requests and the prober would time itself)."""
    return asyncio.run(_burst(base, urls))


async def _burst(base: str, urls: list[str]) -> list[tuple[int, str | None, float]]:
    limits = httpx.Limits(max_connections=READS, max_keepalive_connections=READS)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def one(url: str) -> tuple[int, str | None, float]:
            t0 = time.monotonic()
            r = await client.get(url)
            return r.status_code, r.headers.get("retry-after"), time.monotonic() - t0

        return await asyncio.gather(*(one(u) for u in urls))


def _wait(http: httpx.Client, job_id: int, statuses: tuple[str, ...], timeout: float) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = http.get(f"/api/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not {statuses} in {timeout} s: {job}")


@pytest.mark.parametrize("store", STORES)
def test_300_concurrent_reads_leave_running_jobs_alone(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with store_url(request, store, tmp_path / "gdnval.db") as url:
        server = make_server(tmp_path, GDNVAL_DB_URL=url, GDNVAL_DEVICE_LIMITS='{"cpu": 2}')
        server.start()
        try:
            _burst_during_jobs(server.base, store)
        finally:
            server.stop()


def _burst_during_jobs(base: str, store: str) -> None:
    with httpx.Client(base_url=base, timeout=30) as http:
        real = http.post("/api/v1/jobs", json={"suite": "capability", "device": "cpu"}, headers=AUTH).json()
        fake = http.post("/api/v1/jobs", json={"suite": FAKE, "params": FAKE_PARAMS}, headers=AUTH).json()
        _wait(http, real["id"], ("running",), 60)
        _wait(http, fake["id"], ("running",), 60)

        probes: list[tuple[int, float]] = []
        stop = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=base, timeout=10) as c:
                while not stop.is_set():
                    t0 = time.monotonic()
                    status = c.get("/healthz").status_code
                    probes.append((status, time.monotonic() - t0))
                    time.sleep(0.05)

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        urls = [u for _ in range(READS // 3)
                for u in ("/api/v1/jobs", f"/jobs/{real['id']}", f"/api/v1/jobs/{fake['id']}")]
        t0 = time.monotonic()
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = pool.submit(burst_in_process, base, urls).result(timeout=300)
        wall = time.monotonic() - t0
        stop.set()
        prober.join(15)

        statuses = Counter(status for status, _, _ in results)
        ok = [t for s, _, t in results if s == 200] or [0.0]
        health = [t for _, t in probes] or [0.0]
        print(f"\n[{store}] {READS} reads in {wall:.1f} s: {dict(statuses)}; the 200s: p50 "
              f"{statistics.median(ok):.2f} s, p99 {_p(ok, 0.99):.2f} s; /healthz: {len(probes)} probes, "
              f"p50 {statistics.median(health) * 1000:.0f} ms, p99 {_p(health, 0.99) * 1000:.0f} ms, "
              f"max {max(health) * 1000:.0f} ms")
        assert statuses[500] == 0, statuses
        assert all(s == 200 or (s == 503 and ra) for s, ra, _ in results), statuses
        assert statuses[200] > 0, statuses
        assert probes and all(s == 200 for s, _ in probes)
        assert _p(health, 0.99) < 1.0, sorted(health)[-5:]

        real_done = _wait(http, real["id"], ("succeeded", "failed", "cancelled"), 300)
        fake_done = _wait(http, fake["id"], ("succeeded", "failed", "cancelled"), 120)
        assert real_done["status"] == "succeeded", real_done
        assert fake_done["status"] == "succeeded" and fake_done["verdict"] == "passed", fake_done
        samples = http.get(f"/api/v1/jobs/{fake['id']}/samples?format=ndjson").text.splitlines()
        assert len(samples) == FAKE_PARAMS["cases"] * FAKE_PARAMS["samples"] * 2  # nothing lost
