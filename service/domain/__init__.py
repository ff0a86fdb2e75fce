"""The service's rules: compare, gate, report, baselines and what a submission must satisfy. No
FastAPI here: HTTP is `service.api` and `service.web`; rows come from `service.persistence` (the
compare loader in `baselines.py` still runs its own read queries)."""
