"""service: the FastAPI app, results store, queue and dispatcher, compare/gate, pages and CLI.

Layers, imports pointing down only (checked by tests/test_imports.py): `api`/`web` ->
`dispatcher` -> `domain` -> `persistence` -> `persistence.models`. Never imports torch at import
time: it runs on head nodes without an accelerator.
"""
