"""`/suites`: the suite catalogue."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from service.presentation import views
from service.presentation.numbers import fmt
from service.web.deps import (
    page,
    require_page_read,
    suite_names,
)
from workers.registry import get_suite

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_read)])


@router.get("/suites", response_class=HTMLResponse)
def suites_page(request: Request) -> HTMLResponse:
    out = []
    for name in suite_names():
        try:
            d = get_suite(name).describe()
        except Exception as exc:  # a broken suite module must not take the catalogue down
            out.append({"name": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        for m in d["metrics"]:
            bound = m.get("bound")
            rel = "≤" if m.get("direction") == "lower" else "≥"
            unit = views.shown_unit(m.get("unit", ""))
            m["bound_text"] = f"{rel} {fmt(bound, unit)}" if bound is not None else "–"
        for p in d["presets"].values():
            for c in p["cases"]:
                c["short"] = views.short_params(c["params"], limit=12)
        out.append(d)
    return page(request, "suites.html", nav="suites", suites=out)
