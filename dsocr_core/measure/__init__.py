"""Measurement: sweeps, dataset runs over real pages, operator breakdowns, parity runs, environment capture and
the one assembly of stage statistics."""
