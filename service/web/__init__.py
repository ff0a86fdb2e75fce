"""The results pages, server-rendered (Jinja2 + server-side SVG), served by the service app.

Pages (all read-only except the submit form; with `protect_reads` they need a login):

- `/jobs`: the job list, filters by status/suite/commit, live rows (`/jobs/rows`, polled by
  `static/gdnval.js`), and a form that submits a job with the API token.
- `/jobs/{id}`: header (commit, device, versions, times, error), the report's tables (accuracy per
  tensor, speed with the speed-up against eager/Ulysses, memory, trajectories, checks), one
  section per case (`#case-{fingerprint}`, the anchor reports link to) with its plots, downloads
  (samples from the API, artifacts, `/jobs/{id}/report.md`).
- `/compare?base=&head=`: two jobs, commits or a named baseline; per case and metric the verdict
  and its evidence; `show=changes|regressions|all`.
- `/history?suite=` (or `fingerprint=`, one case): a repository's commits in first-parent order,
  one point per commit pooled over its jobs, judged against the commit measured before by the
  compare engine; one series (`metric=`) as a chart, else every series as sparklines.
- `/gates`, `/gates/{id}`: the stored gates (filters by head, base, backend, verdict).
- `/suites`: the catalogue.

Modules: `routes/` (one router per page), `deps` (templates, the login check), `charts` (SVG).
The rows they print come from `service.presentation.views`, the plot data from
`service.persistence.page_queries`.
"""
