"""One package per suite: its `spec` module (parameters, presets, metrics, case matrix; no torch) and
its `run` module (the code its ranks run). `shared` holds what several suites use; no suite imports
another. Each spec is registered in workers.registry.SUITE_MODULES."""
