"""One input rule for every route and both stores: what SQLite would store but PostgreSQL cannot
(or what neither should) is refused before a handler runs.

- Text (path, query string, form fields, JSON strings and keys) must not contain NUL or a lone
  UTF-16 surrogate: PostgreSQL cannot store either.
- JSON bodies are strict: no NaN or Infinity, no duplicate keys, nesting at most `MAX_DEPTH`. A
  body is JSON by the test FastAPI itself applies before parsing one (`is_json_type`: the media
  type `application/json` or `application/<anything>+json`, parameters and case aside), whatever
  the method; form bodies are urlencoded or multipart, and every field of either is text.
- Integers a route compares with a column are typed `DbInt`/`DbId` (the range of PostgreSQL's
  int4, which every id and count column is).

The API answers 422 (problem details); pages answer 404 for a bad path and 400 for a bad query
or body. A request without the credentials the service asks for is left to the guarded route's
401 first (nothing about it is judged before). `InputRule` is an ASGI middleware on the whole
app, so a route added later gets the rule without asking; the problem handlers
(`service.api.problems`) turn a store's own refusal of a value that slipped past (an
out-of-range integer) into the same answers instead of a 500.
"""

from __future__ import annotations

import email.message
import json
import re
from collections.abc import Iterable
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import Path, Query
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import MEDIA_TYPE, problem_body
from service.web_session import COOKIE, READ_METHODS

INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1
INT8_MAX = 2**63 - 1  # BIGINT ids (samples)
MAX_ID = INT4_MAX  # ids are INTEGER columns: PostgreSQL's int4 ends here
MAX_DEPTH = 32
DbId = Annotated[int, Path(ge=1, le=MAX_ID)]
DbIdQuery = Annotated[int, Query(ge=1, le=MAX_ID)]
DbIntQuery = Annotated[int, Query(ge=INT4_MIN, le=INT4_MAX)]
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_FORM_TYPE = "application/x-www-form-urlencoded"
_MULTIPART_TYPE = "multipart/form-data"


class BadInput(ValueError):
    """A value no store takes; the message names where it is and what was expected."""


def check_text(value: str, where: str) -> str:
    """`value` when both stores can hold it, else `BadInput` naming `where`."""
    bad = _UNSTORABLE.search(value)
    if bad is not None:
        raise BadInput(
            f"{where} contains the character U+{ord(bad.group()):04X} at offset {bad.start()}, "
            "which cannot be stored; expected text without NUL or unpaired surrogates"
        )
    return value


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BadInput(f"duplicate JSON key {key!r}; expected each key once")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise BadInput(f"JSON value {name} is not allowed; expected a finite number")


def _walk(value: Any, where: str, depth: int = 1) -> None:
    if depth > MAX_DEPTH:
        raise BadInput(f"{where} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, f"key {k!r} of {where}")
            _walk(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk(v, f"{where}[{i}]", depth + 1)


def loads(text: str | bytes, where: str = "the JSON body") -> Any:
    """Strict JSON: NaN, Infinity, duplicate keys, deep nesting and unstorable text are errors."""
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except RecursionError as exc:
        raise BadInput(f"{where} is nested deeper than {MAX_DEPTH} levels") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"JSON decode error in {where}: {exc}") from exc
    _walk(value, where)
    return value


def media_type(content_type: str) -> str:
    """The media type of a Content-Type header value, lower-cased, without its parameters."""
    message = email.message.Message()
    message["content-type"] = content_type
    return message.get_content_type()


def is_json_type(content_type: str) -> bool:
    """Whether FastAPI parses a body of this Content-Type as JSON (its own test, in
    `fastapi.routing`): application/json or application/*+json."""
    maintype, _, subtype = media_type(content_type).partition("/")
    return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))


def _check_pairs(pairs: Iterable[tuple[str, str]], where: str) -> None:
    for key, value in pairs:
        check_text(key, f"{where} name {key!r}")
        check_text(value, f"{where} {key!r}")


def _is_api(path: str) -> bool:
    return path.startswith("/api/")


def _auth_first(scope: Scope, settings: Any) -> bool:
    """A request that carries no credentials where the service asks for them: its 401 comes
    before anything about the request is judged (the guarded routes answer it, then nothing of
    the input reaches a store)."""
    if settings is None or settings.token() is None:
        return False
    headers = dict(scope.get("headers") or [])
    if b"authorization" in headers or COOKIE.encode() in headers.get(b"cookie", b""):
        return False
    return scope.get("method") not in READ_METHODS or bool(settings.protect_reads)


class InputRule:
    """Refuse unstorable path, query and body input for every route (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: Any = None) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        api = _is_api(path)
        if api and _auth_first(scope, self.settings):
            await self.app(scope, receive, send)
            return
        try:
            check_text(path, "the path")
        except BadInput as exc:
            await _reject(send, 422 if api else 404, str(exc))
            return
        if _auth_first(scope, self.settings):
            await self.app(scope, receive, send)
            return
        try:
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True,
                              errors="surrogateescape")
            _check_pairs(query, "query parameter")
        except (BadInput, ValueError) as exc:
            await _reject(send, 422 if api else 400, str(exc))
            return
        headers = dict(scope.get("headers") or [])
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        json_body = bool(content_type) and is_json_type(content_type)
        kind = media_type(content_type) if content_type else ""
        if not json_body and kind not in (_FORM_TYPE, _MULTIPART_TYPE):
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        messages: list[Message] = []
        while more:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            more = bool(message.get("more_body"))
        try:
            if kind == _FORM_TYPE:
                text = body.decode("latin-1")
                _check_pairs(parse_qsl(text, keep_blank_values=True, errors="surrogateescape"), "form field")
            elif kind == _MULTIPART_TYPE:
                await _check_multipart(scope, body)
            elif body.strip():
                loads(body)
        except BadInput as exc:
            await _reject(send, 422 if api or not json_body else 400, str(exc))
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _check_multipart(scope: Scope, body: bytes) -> None:
    """Every field name, value and file name of a multipart body as text (`check_text`); a body
    that does not parse is left to the route, which answers it."""

    async def once() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(scope, once).form()
    except Exception:
        return
    try:
        for key, value in form.multi_items():
            check_text(key, f"form field name {key!r}")
            if isinstance(value, UploadFile):
                check_text(value.filename or "", f"file name of form field {key!r}")
            else:
                check_text(value, f"form field {key!r}")
    finally:
        await form.close()


async def _reject(send: Send, status: int, detail: str) -> None:
    body = problem_body(status, detail)
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})
