"""Starting the dashboard for tests that talk to it over HTTP (the browser test, the ./dashboard test)."""
from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_served(proc, url: str, log_path: Path, timeout_s: float, what: str) -> None:
    """Poll Streamlit's health endpoint until it answers 'ok'; fail the test with the log's tail if the process
    exits or `timeout_s` passes first."""
    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail(f"{what} did not serve the app:\n{Path(log_path).read_text()[-3000:]}")
        time.sleep(0.3)
