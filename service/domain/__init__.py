"""The service's rules: compare, gate, report, baselines and what a submission must satisfy. No
FastAPI and no SQL here: HTTP is `service.api` and `service.web`, rows come from
`service.persistence` (a `Session` is only passed through)."""
