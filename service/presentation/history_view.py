"""What the history page prints of a `service.domain.history.History`: one row per commit of
the range and one per series, with each number shown by the compare page's rule (the median
for time, the worst value otherwise; `views.stat_text`) and each verdict the compare engine's."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from service.domain.history import History, Point, Series
from service.presentation.markdown import short_sha
from service.presentation.views import stat_text


def judged_value(series: Series, point: Point) -> float | None:
    """The statistic a point is judged on (compare's: the median for time, the worst value else)."""
    if point.stats is None:
        return None
    return point.stats.median if series.kind == "time" else point.stats.worst


def commit_rows(history: History) -> list[dict[str, Any]]:
    """Per commit, oldest first: its jobs, the commit it was compared with and the verdict."""
    return [{"sha": c.commit, "short": short_sha(c.commit)[:10], "jobs": c.jobs,
             "against": short_sha(c.against)[:10] if c.against else None, "verdict": c.verdict}
            for c in history.commits]


def point_rows(series: Series) -> list[dict[str, Any]]:
    """One series' points, oldest first, with their statistics and verdicts."""
    rows = []
    for p in series.points:
        st = p.stats
        rows.append({
            "sha": p.commit, "short": short_sha(p.commit)[:10], "jobs": p.jobs,
            "value": stat_text(judged_value(series, p), series.unit),
            "min": stat_text(st.min if st else None, series.unit),
            "p90": stat_text(st.p90 if st else None, series.unit),
            "max": stat_text(st.max if st else None, series.unit),
            "n": st.count if st else 0, "verdict": p.verdict, "reason": p.reason,
            "against": short_sha(p.against)[:10] if p.against else None,
        })
    return rows


def series_rows(history: History, query: dict[str, Any]) -> list[dict[str, Any]]:
    """Per series: its latest point's value and verdict, and the link to its own history."""
    rows = []
    for s in history.series:
        last = s.points[-1] if s.points else None
        rows.append({
            "case": s.case, "fingerprint": s.fingerprint, "metric": s.metric, "backend": s.backend,
            "latest": stat_text(judged_value(s, last), s.unit) if last else "–",
            "verdict": last.verdict if last else None, "reason": last.reason if last else "",
            "changed": sum(p.verdict not in (None, "unchanged") for p in s.points),
            "values": [judged_value(s, p) for p in s.points],
            "href": "/history?" + urlencode({**query, "fingerprint": s.fingerprint, "metric": s.metric}),
        })
    return rows
