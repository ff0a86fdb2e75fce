"""A bounded number of requests in front of the store, so a burst of readers can never take the
connections or the threads the rest of the service needs.

At most `limit` reads (GET and HEAD requests) run at once; up to `limit * QUEUE_FACTOR` more
wait up to `wait_s` for a turn; the rest, and those whose wait ran out, are answered 503 with
`Retry-After` at once and without touching the store. Health probes, static files and the API
documentation are never held back; writes need the token and are not counted (the request pool
keeps connections for them beyond the reads' share). The dispatcher (and with it the executors' sinks and
heartbeats) writes through an engine of its own (`service.app`), which no request can take.
"""

from __future__ import annotations

import asyncio
import math

from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.problems import MEDIA_TYPE, problem_body

READ_METHODS = frozenset({"GET", "HEAD"})
EXEMPT_PREFIXES = ("/healthz", "/readyz", "/static/", "/docs", "/openapi.json")
RETRY_AFTER_S = 1
QUEUE_FACTOR = 4


class ReadLimit:
    """ASGI middleware: `limit` reads at a time, a wait of at most `wait_s`, then 503."""

    def __init__(self, app: ASGIApp, limit: int, wait_s: float) -> None:
        self.app, self.limit, self.wait_s = app, limit, wait_s
        self._slots: asyncio.Semaphore | None = None  # made in the server's event loop
        self._waiting = 0
        self._busy_body = problem_body(
            503, f"the service is answering {limit} reads already; retry in {RETRY_AFTER_S} s"
        )  # made once: a flood of refusals costs the event loop as little as possible

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") not in READ_METHODS
                or scope.get("path", "").startswith(EXEMPT_PREFIXES)):
            await self.app(scope, receive, send)
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        slots = self._slots
        if slots.locked() and self._waiting >= self.limit * QUEUE_FACTOR:
            await _busy(send, self._busy_body)
            return
        self._waiting += 1
        try:
            await asyncio.wait_for(slots.acquire(), timeout=self.wait_s)
        except TimeoutError:
            await _busy(send, self._busy_body)
            return
        finally:
            self._waiting -= 1
        try:
            await self.app(scope, receive, send)
        finally:
            slots.release()


async def _busy(send: Send, body: bytes) -> None:
    await send({
        "type": "http.response.start", "status": 503,
        "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(math.ceil(RETRY_AFTER_S)).encode())],
    })
    await send({"type": "http.response.body", "body": body})
