"""Each suite's part of the report, one module per suite, keyed by the suite's name.

The report (`service.presentation.report_build`) looks up the module named after a suite
(`cp-layer` -> `cp_layer`) and calls its `report(inp: SuiteInput) -> SuiteReport`: the suite's
sections (plain tables, `service.presentation.report_model`), its plots, its conclusion lines
and a line for each of its sections these jobs cannot give. A suite without a module here gets
the generic section (`service.presentation.report_generic`: every judged metric in a table).
docs/howto-suite.md shows how to add one.
"""
