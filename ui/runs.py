"""How a stored run is named wherever the pages list one: ui.measured.run_title plus the session mode it was
measured in (reference | fast; the run store records it with every run), and its order check."""
from __future__ import annotations

import streamlit as st

from dsocr_core.measure.order_check import summary as order_summary

from . import measured as ms


def run_mode(run: dict) -> str:
    """e.g. 'fast session mode' ('unrecorded session mode' for runs stored before modes were recorded)."""
    return f"{run.get('session_mode') or 'unrecorded'} session mode"


def run_session_mode(run: dict) -> str:
    """The mode a run's prediction is made in: its own (runs stored before modes were recorded ran the
    reference engine, the only one there was)."""
    return run.get("session_mode") or "reference"


def run_title(run: dict) -> str:
    return f"{ms.run_title(run)} · {run_mode(run)}"


def show_order_check(run: dict) -> None:
    """The run's order check (its first point measured again after the others): an error when the two
    measurements disagree beyond their spread, else a caption; nothing for runs without one."""
    text = order_summary((run.get("meta") or {}).get("order_check"))
    if text and "FAILED" in text:
        st.error(ms.md(text))
    elif text:
        st.caption(ms.md(text))
