"""Run a script under Triton's interpreter (TRITON_INTERPRET=1 must be set before Triton is imported, hence a
subprocess) and read back the JSON object it prints on a line starting with RESULT: how the CPU tests check the
fast engine's Triton kernels."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def interpreted_result(script: str, timeout: int = 900) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])
