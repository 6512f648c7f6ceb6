"""How a stored run is named wherever the pages list one: ui.measured.run_title plus the session mode it was
measured in (reference | fast; the run store records it with every run)."""
from __future__ import annotations

from . import measured as ms
from . import resources


def run_mode(run: dict) -> str:
    """e.g. 'fast session mode' ('unrecorded session mode' for runs stored before modes were recorded)."""
    return f"{run.get('session_mode') or 'unrecorded'} session mode"


def run_session_mode(run: dict) -> str:
    """The mode a run's prediction is made in: its own (runs stored before modes were recorded ran the
    reference engine, the only one there was)."""
    return run.get("session_mode") or "reference"


def run_title(run: dict, size: bool = True) -> str:
    """size=False for a picker whose run may still be growing: a keyed selectbox keeps the option texts it was
    first drawn with, so a count in them stays at what it was when the run started ('[dataset run, 0 points]'
    under a finished run of 4 pages)."""
    return f"{ms.run_title(run, str(resources.reference_dir()), size)} · {run_mode(run)}"
