"""One module per suite; each defines `SUITE`. Registered in workers.registry.SUITE_MODULES."""
