"""`/login` and `/logout`: the pages' session cookie when reads are protected."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.api.deps import get_settings, record_failure, refuse_if_locked
from service.web.deps import page
from service.web_session import COOKIE, session_keys

router = APIRouter(include_in_schema=False)


def _safe_next(target: str | None) -> str:
    """Only a path on this site (no scheme, no '//host'): an open redirect is not a feature."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/jobs"
    return target


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str | None = None) -> HTMLResponse:
    return page(request, "login.html", nav="", next=_safe_next(next), message=None)


@router.post("/login", response_class=HTMLResponse)
def login(request: Request, token: str = Form(""), next: str = Form("/jobs")) -> Response:
    """Trade the API token for a session cookie (HttpOnly, SameSite=Lax) so pages can be read."""
    expected = get_settings(request).token()
    target = _safe_next(next)
    if expected is None:
        return RedirectResponse(target, status_code=303)
    refuse_if_locked(request)
    if not hmac.compare_digest(token.encode(), expected.encode()):
        record_failure(request)
        return page(request, "login.html", 401, nav="", next=target, message="Wrong token.")
    keys = session_keys(request)
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(COOKIE, keys.issue(expected), max_age=int(keys.ttl_s), httponly=True, samesite="lax",
                    secure=request.url.scheme == "https", path="/")
    return resp


@router.post("/logout")
def logout(request: Request) -> RedirectResponse:
    """End the session: revoked on the server (a copied cookie stops working too), dropped here.

    A POST carrying the session cookie: the cookie is SameSite=Lax, so another site's form or
    link cannot send it, and a request without it changes nothing."""
    token = get_settings(request).token()
    given = request.cookies.get(COOKIE, "")
    resp = RedirectResponse("/login", status_code=303)
    if given:
        if token is not None:
            session_keys(request).revoke(token, given)
        resp.delete_cookie(COOKIE, path="/")
    return resp
