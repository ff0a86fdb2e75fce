"""The service's rules: compare, gate, report and baselines. No FastAPI and no SQL here: rows come
from `service.persistence`, HTTP from `service.api` and `service.web`."""
