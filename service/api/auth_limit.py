"""Failed token checks per client, with a lockout: guessing the API token (bearer header, login
form, submit form) is limited to a few tries a minute per client address.

After `MAX_FAILURES` failures within `WINDOW_S`, the client is refused with 429 and
`Retry-After` for `LOCKOUT_S`, even with the right token, so a guess that comes right during
the lockout tells nothing. In memory, per process.
"""

from __future__ import annotations

import threading
import time

from fastapi import HTTPException, Request

MAX_FAILURES = 10
WINDOW_S = 60.0
LOCKOUT_S = 60.0
_MAX_CLIENTS = 10_000  # forget the oldest beyond this, so a flood of addresses cannot grow it


class FailureLimiter:
    def __init__(self, max_failures: int = MAX_FAILURES, window_s: float = WINDOW_S,
                 lockout_s: float = LOCKOUT_S) -> None:
        self.max_failures, self.window_s, self.lockout_s = max_failures, window_s, lockout_s
        self._lock = threading.Lock()
        self._failures: dict[str, list[float]] = {}
        self._locked_until: dict[str, float] = {}

    def retry_after(self, client: str) -> int:
        """Seconds until `client` may try again (0: now)."""
        with self._lock:
            left = self._locked_until.get(client, 0.0) - time.monotonic()
            return max(0, int(left + 0.999))

    def failed(self, client: str) -> None:
        now = time.monotonic()
        with self._lock:
            recent = [t for t in self._failures.get(client, []) if now - t < self.window_s]
            recent.append(now)
            self._failures[client] = recent
            if len(recent) >= self.max_failures:
                self._locked_until[client] = now + self.lockout_s
                self._failures[client] = []
            while len(self._failures) > _MAX_CLIENTS:
                self._failures.pop(next(iter(self._failures)))
            while len(self._locked_until) > _MAX_CLIENTS:
                self._locked_until.pop(next(iter(self._locked_until)))


def limiter_of(request: Request) -> FailureLimiter:
    state = request.app.state
    limiter = getattr(state, "auth_limiter", None)
    if limiter is None:
        limiter = state.auth_limiter = FailureLimiter()
    return limiter


def client_of(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def refuse_if_locked(request: Request) -> None:
    """429 with Retry-After while this client is locked out after too many wrong tokens."""
    wait = limiter_of(request).retry_after(client_of(request))
    if wait:
        raise HTTPException(429, f"too many wrong tokens from this client; retry in {wait} s",
                            headers={"Retry-After": str(wait)})


def record_failure(request: Request) -> None:
    limiter_of(request).failed(client_of(request))
