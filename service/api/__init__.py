"""The REST API (`/api/v1`): dependencies in `deps`, pydantic schemas in `schemas`, one router per
resource in `routes/`, the error shape in `problems`."""
