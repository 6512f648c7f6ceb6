"""Streamlit side of the dashboard: routing, sidebar, cached wrappers of dsocr_core, chart builders.

Everything that computes a cost, runs the model or reads the run store lives in dsocr_core; this package only
wires widgets to those calls, caches them (`st.cache_resource` / `st.cache_data`) and draws the results.
"""
from .routing import app_context, page_setup

__all__ = ["app_context", "page_setup"]
