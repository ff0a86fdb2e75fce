"""service: the FastAPI app, results store, queue and dispatcher, compare/gate, pages and CLI.

Never imports torch at import time: it runs on head nodes without an accelerator.
"""
