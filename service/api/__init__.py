"""The REST API (`/api/v1`): pydantic schemas in `schemas`, the routers in `routes`."""
