"""The browser's login session, shared by the pages and the API's reads.

With `protect_reads`, a browser cannot send the API's bearer header on a plain link, so /login
trades the API token for an HttpOnly, SameSite=Lax cookie. The cookie is a signed session, never
the token:

    v1.<session id>.<expiry, unix seconds>.<HMAC-SHA256 of the first three parts>

signed with a key derived from the API token and the service's session secret
(`GDNVAL_SESSION_SECRET`; unset: a random secret per process). A session ends at its expiry
(`session_ttl_s`), at /logout (its id is revoked until it would have expired anyway), when the
API token changes, and, with the per-process secret, when the service restarts. Replicas behind
one address need the same `GDNVAL_SESSION_SECRET`; a logout is then revoked on the replica that
answered it (and the browser drops the cookie), so keep `session_ttl_s` short there.

Pages need a session; the API accepts it for GET/HEAD reads only, so the job page's download
links (samples, artifacts) work for a logged-in reader while writes still need the bearer token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time

from starlette.requests import Request

COOKIE = "gdnval_session"
READ_METHODS = frozenset({"GET", "HEAD"})
_VERSION = "v1"


class SessionKeys:
    """The signing secret and the revoked session ids of one service process."""

    def __init__(self, secret: str | None, ttl_s: float) -> None:
        self.secret = (secret or secrets.token_hex(32)).encode()
        self.ttl_s = ttl_s
        self._revoked: dict[str, float] = {}  # session id -> its expiry (forgotten after it)
        self._lock = threading.Lock()

    def _key(self, token: str) -> bytes:
        return hmac.new(self.secret, b"gdnval-web-session\0" + token.encode(), hashlib.sha256).digest()

    def _sign(self, token: str, payload: str) -> str:
        return hmac.new(self._key(token), payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, token: str, now: float | None = None) -> str:
        """A new session cookie value for a reader who proved they know `token`."""
        expiry = int((now if now is not None else time.time()) + self.ttl_s)
        payload = f"{_VERSION}.{secrets.token_urlsafe(18)}.{expiry}"
        return f"{payload}.{self._sign(token, payload)}"

    def _parse(self, token: str, value: str) -> tuple[str, float] | None:
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[2].isdigit():
            return None
        payload = ".".join(parts[:3])
        if not hmac.compare_digest(parts[3].encode(), self._sign(token, payload).encode()):
            return None
        return parts[1], float(parts[2])

    def valid(self, token: str, value: str, now: float | None = None) -> bool:
        """The cookie is ours, unexpired and not revoked."""
        parsed = self._parse(token, value)
        if parsed is None:
            return False
        sid, expiry = parsed
        now = now if now is not None else time.time()
        if expiry <= now:
            return False
        with self._lock:
            return sid not in self._revoked

    def revoke(self, token: str, value: str, now: float | None = None) -> None:
        """End the session of this cookie value (a /logout)."""
        parsed = self._parse(token, value)
        if parsed is None:
            return
        now = now if now is not None else time.time()
        with self._lock:
            self._revoked = {s: e for s, e in self._revoked.items() if e > now}  # forget expired ones
            self._revoked[parsed[0]] = parsed[1]


def session_keys(request: Request) -> SessionKeys:
    """The app's session keys (made once per app from its settings)."""
    state = request.app.state
    keys = getattr(state, "session_keys", None)
    if keys is None:
        settings = state.settings
        secret = settings.session_secret.get_secret_value() if settings.session_secret else None
        keys = state.session_keys = SessionKeys(secret, settings.session_ttl_s)
    return keys


def has_session(request: Request, token: str) -> bool:
    """The request carries a valid login cookie for `token`."""
    given = request.cookies.get(COOKIE, "")
    return bool(given) and session_keys(request).valid(token, given)
