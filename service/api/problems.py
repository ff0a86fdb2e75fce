"""One error shape for every error the service answers: RFC 9457 problem details.

Every 4xx/5xx body is `application/problem+json`:

    {"type": "about:blank", "title": "Unprocessable Content", "status": 422,
     "detail": "world_size 9 on 'cpu' can never be satisfied: ...",
     "errors": [{"loc": ["body", "world_size"], "msg": "...", "type": "..."}]}

`detail` is always one human-readable string naming the bad value and what was expected (the
CLI prints it as is); `errors` lists the individual field errors of a request that failed
validation (absent otherwise). `install(app)` registers the handlers and makes the OpenAPI
document declare this shape, the statuses each operation can answer, and the bearer scheme.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import compile_path

log = logging.getLogger("gdnval.service")
MEDIA_TYPE = "application/problem+json"


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class Problem(BaseModel):
    """RFC 9457 problem details, the body of every error answer."""

    type: str = Field("about:blank", description="a URI naming the problem type; about:blank = the status")
    title: str = Field(description="the status phrase")
    status: int = Field(ge=400, le=599)
    detail: str = Field(description="what was wrong, naming the bad value and what was expected")
    errors: list[FieldError] | None = Field(None, description="the field errors of an invalid request")


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_body(status: int, detail: str, errors: list[dict[str, Any]] | None = None) -> bytes:
    """The encoded problem document (also used by middleware that answers before routing)."""
    doc = Problem(title=_title(status), status=status, detail=detail, errors=errors)  # type: ignore[arg-type]
    return doc.model_dump_json(exclude_none=True).encode()


def problem(status: int, detail: str, errors: list[dict[str, Any]] | None = None,
            headers: dict[str, str] | None = None) -> Response:
    return Response(problem_body(status, detail, errors), status_code=status, media_type=MEDIA_TYPE,
                    headers=headers)


def _first_line(exc: Exception) -> str:
    return (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _field_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for e in exc.errors():
        loc = [p if isinstance(p, int) else str(p) for p in e.get("loc", ())]
        msg = str(e.get("msg", ""))
        if "input" in e and e.get("type") != "missing":
            shown = repr(e["input"])
            msg += f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
        out.append({"loc": loc, "msg": msg, "type": str(e.get("type", ""))})
    return out


def _summary(errors: list[dict[str, Any]]) -> str:
    parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (a 405 lists them all, not just one route's)."""
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.router.routes):  # included routers' routes too
        route_methods = getattr(route, "methods", None)
        path = getattr(route, "path_format", None)
        if route_methods and path and compile_path(path)[0].match(request.url.path):
            methods |= set(route_methods)
    return sorted(methods)


def install(app: FastAPI) -> None:
    """Problem-details handlers for every error, and an OpenAPI document that declares them."""

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code < 400:  # a redirect raised by a page (log in first)
            return Response(status_code=exc.status_code, headers=headers)
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(request))
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return problem(exc.status_code, detail, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = _field_errors(exc)
        if request.method == "GET" and not request.url.path.startswith("/api/"):
            return problem(404, _summary(errors), errors)  # a page address that names nothing
        return problem(422, _summary(errors), errors)

    @app.exception_handler(DataError)
    @app.exception_handler(OverflowError)
    async def _unstorable(request: Request, exc: Exception) -> Response:
        """A value the store refused (an integer past its column's range): the request's fault."""
        status = 422 if request.url.path.startswith("/api/") else 404
        return problem(status, f"a value of the request is outside what the store holds: {_first_line(exc)}")

    @app.exception_handler(OperationalError)
    @app.exception_handler(PoolTimeout)
    async def _store_busy(request: Request, exc: Exception) -> Response:
        log.error("store error on %s: %s", request.url.path, exc)
        return problem(503, "the results store is busy or unreachable; retry", headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, f"internal error ({type(exc).__name__}); the service log has the details")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            declare(schema, app.routes, protect_reads=bool(app.state.settings.protect_reads))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# ------------------------------------------------------------------------------------- OpenAPI

_REF = {"$ref": "#/components/schemas/Problem"}


def _depends_on(route: Any, names: Iterable[str]) -> bool:
    wanted = set(names)
    todo = list(route.dependant.dependencies)
    while todo:
        dep = todo.pop()
        if getattr(dep.call, "__name__", "") in wanted:
            return True
        todo.extend(dep.dependencies)
    return False


def _statuses(route: Any, method: str, protect_reads: bool) -> dict[int, str]:
    writes = _depends_on(route, ["require_write"])
    reads = _depends_on(route, ["require_read"])
    out: dict[int, str] = {}
    if writes or (reads and protect_reads):
        out |= {401: "no credentials", 403: "credentials not valid for this service"}
    if route.dependant.path_params or route.dependant.body_params or route.path.startswith("/api/"):
        out[404] = "no such resource"
    if method in ("POST", "PUT", "PATCH"):
        out |= {400: "the body cannot be parsed", 409: "the request conflicts with the resource's state",
                413: "the body is over the size limit"}
    if route.dependant.path_params or route.dependant.query_params or route.dependant.body_params:
        out[422] = "the request is invalid (the problem names the value and what was expected)"
    if route.path.startswith("/api/"):
        out[503] = "the results store or a suite module is unavailable"
    return out


def declare(schema: dict[str, Any], routes: Iterable[Any], *, protect_reads: bool) -> None:
    """Declare the problem shape for every error status every API operation can answer, and the
    bearer scheme on operations that need the token."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas["FieldError"] = schemas["Problem"].pop("$defs")["FieldError"]
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http", "scheme": "bearer", "description": "the service's API token (GDNVAL_API_TOKEN)",
    }
    paths = schema.get("paths", {})
    for route in iter_route_contexts(list(routes)):  # the routes of included routers, as mounted
        if not isinstance(route.original_route, APIRoute) or not route.include_in_schema:
            continue
        path = paths.get(route.path_format)
        if path is None:
            continue
        for method in route.methods:
            op = path.get(method.lower())
            if op is None:
                continue
            responses = op.setdefault("responses", {})
            for status, why in _statuses(route, method, protect_reads).items():
                responses[str(status)] = {"description": why, "content": {MEDIA_TYPE: {"schema": _REF}}}
            guarded = _depends_on(route, ["require_write"]) or (
                protect_reads and _depends_on(route, ["require_read"])
            )
            if guarded:
                op["security"] = [{"bearer": []}]
