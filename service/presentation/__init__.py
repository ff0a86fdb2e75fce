"""How stored results are presented to a reader: Markdown reports."""
