"""The read limit in front of the store: a full house answers 503 with Retry-After within the
wait, never queues without bound, and never holds back the health probes."""

from __future__ import annotations

import asyncio
import time

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from service.api.read_limit import QUEUE_FACTOR, ReadLimit

LIMIT, WAIT_S = 2, 0.3


async def _scenario() -> None:
    gate = asyncio.Event()

    async def held(request: Request) -> PlainTextResponse:
        await gate.wait()  # a read that holds its turn until the test lets it go
        return PlainTextResponse("read")

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    inner = Starlette(routes=[Route("/api/v1/jobs", held), Route("/healthz", health)])
    app = ReadLimit(inner, limit=LIMIT, wait_s=WAIT_S)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        running = [asyncio.create_task(client.get("/api/v1/jobs")) for _ in range(LIMIT)]
        await asyncio.sleep(0.05)

        t0 = time.monotonic()
        waited = await client.get("/api/v1/jobs")
        assert waited.status_code == 503 and waited.headers["retry-after"] == "1"
        assert WAIT_S <= time.monotonic() - t0 < WAIT_S + 0.5  # the wait, then the answer
        assert waited.headers["content-type"] == "application/problem+json"

        t0 = time.monotonic()
        flood = await asyncio.gather(*(client.get("/api/v1/jobs") for _ in range(LIMIT * QUEUE_FACTOR * 3)))
        assert {r.status_code for r in flood} == {503}
        assert time.monotonic() - t0 < WAIT_S + 0.5  # past the queue's length: answered at once

        t0 = time.monotonic()
        probe = await client.get("/healthz")
        assert probe.status_code == 200 and time.monotonic() - t0 < 0.2  # never behind the limit

        gate.set()
        assert [r.status_code for r in await asyncio.gather(*running)] == [200] * LIMIT
        assert (await client.get("/api/v1/jobs")).status_code == 200  # turns come back


def test_a_full_house_answers_503_with_retry_after_and_probes_pass() -> None:
    asyncio.run(_scenario())
