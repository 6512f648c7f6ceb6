"""Measured results: the run store (schema, store, import/export), the analytic-vs-measured join, dataset-run
statistics."""
