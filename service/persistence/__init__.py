"""The results store: engine and migrations (`db`), ORM rows (`models`, every class a `*Row`), and
one module per stored entity. The only layer that writes SQL."""
