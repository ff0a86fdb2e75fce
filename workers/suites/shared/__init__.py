"""What the suites share: `spec` (shapes, the model-level suites' parameters; no torch) and `run`
(their trainer on the ranks). It imports no suite; every suite may import it."""
