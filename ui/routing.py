"""Every page runs inside app.py's `st.navigation`, with the shared sidebar's settings.

Streamlit still knows the old "pages/ directory" mode: on a fresh server (and in every AppTest run) a page
opened by its URL can be executed directly, without app.py. `page_setup()` notices that (no settings were
handed down by app.py in this script run), runs app.py instead, which registers the navigation, draws the
sidebar and runs the requested page properly, and then stops the direct run.
"""
from __future__ import annotations

import runpy
import threading
from contextlib import contextmanager
from pathlib import Path

import streamlit as st

APP_PATH = Path(__file__).resolve().parents[1] / "app.py"
_local = threading.local()  # one script run per thread: the settings app.py hands to the page it runs


@contextmanager
def app_context(settings):
    """app.py wraps `page.run()` in this, so the page can read the sidebar's settings."""
    previous = getattr(_local, "settings", None)
    _local.settings = settings
    try:
        yield
    finally:
        _local.settings = previous


def page_setup():
    """The sidebar's Settings for this run. Called first by every page."""
    settings = getattr(_local, "settings", None)
    if settings is None:  # executed directly (pages/ directory mode): go through the entrypoint instead
        runpy.run_path(str(APP_PATH), run_name="__main__")
        st.stop()
    return settings
