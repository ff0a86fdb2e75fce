"""The pages' routers, one module per page, assembled in the order they must match (the job
list's `/jobs/rows` before the job page's `/jobs/{id}`)."""

from __future__ import annotations

from fastapi import APIRouter

from service.web.routes import (
    campaigns,
    compare,
    finds,
    gates,
    history,
    job,
    jobs,
    login,
    reports,
    static,
    suites,
)

router = APIRouter(include_in_schema=False)
for _module in (static, login, jobs, job, campaigns, compare, history, gates, finds, suites, reports):
    router.include_router(_module.router)
