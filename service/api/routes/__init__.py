"""The API's routers, one module per resource, in the order the app mounts them."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.routes import (
    artifacts,
    baselines,
    campaigns,
    cases,
    compare,
    find,
    gate,
    health,
    history,
    jobs,
    report,
    runs,
    suites,
)

ROUTERS: tuple[APIRouter, ...] = tuple(
    m.router
    for m in (health, jobs, runs, cases, artifacts, suites, baselines, gate, find, compare, history, report,
              campaigns)
)
