"""The browser's login session, shared by the pages and the API's reads.

With `protect_reads`, a browser cannot send the API's bearer header on a plain link, so /login
trades the API token for an HttpOnly, SameSite=Lax cookie holding a keyed hash of the token
(never the token itself). Pages need it; the API accepts it for GET/HEAD reads only, so the
job page's download links (samples, artifacts) work for a logged-in reader while writes still
need the bearer token and an anonymous reader is still refused.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request

COOKIE = "gdnval_session"
READ_METHODS = frozenset({"GET", "HEAD"})


def session_value(token: str) -> str:
    """What the login cookie holds: a keyed hash of the API token, never the token itself."""
    return hmac.new(token.encode(), b"gdnval-web-session", "sha256").hexdigest()


def has_session(request: Request, token: str) -> bool:
    """The request carries a valid login cookie for `token`."""
    given = request.cookies.get(COOKIE, "")
    return bool(given) and hmac.compare_digest(given.encode(), session_value(token).encode())
