"""The `gdn-op` suite: `spec` (cases, metrics, presets, parameters; no torch) and `run` (the ranks)."""
