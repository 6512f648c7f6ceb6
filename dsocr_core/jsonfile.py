"""Reading a JSON file someone else wrote (a calibration profile, a checkpoint's config.json) with bounds set
before anything is parsed: its size (checked on disk, before it is read) and its nesting depth (counted on the
raw bytes, vectorised, so a file nested 100,000 levels deep never reaches the recursive parser or a validator).
Every failure is one exception of the caller's class naming the file: what the CLI prints as one line and what a
page shows as a message.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)  # brackets inside strings do not nest


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of objects and arrays in JSON text (strings skipped), without parsing it."""
    b = np.frombuffer(_STRINGS.sub(b'""', raw), dtype=np.uint8)
    step = np.isin(b, (ord("{"), ord("["))).astype(np.int32) - np.isin(b, (ord("}"), ord("]"))).astype(np.int32)
    return int(np.cumsum(step).max()) if step.size else 0


def check_bytes(raw: bytes, source: str, error: type[Exception], max_bytes: int, max_depth: int) -> None:
    """Raise `error` naming `source` when `raw` is larger than max_bytes or nested deeper than max_depth."""
    if len(raw) > max_bytes:
        raise error(f"{source} is {len(raw):,} bytes, larger than the limit of {max_bytes:,} bytes")
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise error(f"{source} is nested {depth:,} levels deep, deeper than the limit of {max_depth}")


def read_bytes(path: str | Path, error: type[Exception], max_bytes: int) -> bytes:
    """The file's bytes, its size checked on disk first (a huge file is refused without being read)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(f"{path} is {size:,} bytes, larger than the limit of {max_bytes:,} bytes")
        return path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


def parse(text: str | bytes, source: str, error: type[Exception]) -> Any:
    """json.loads with the errors it can raise besides a syntax error (an integer of more than 4,300 digits,
    nesting past the interpreter's recursion limit) turned into `error` naming `source`; a syntax error
    (json.JSONDecodeError) passes through for the caller to describe."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except UnicodeDecodeError:
        raise error(f"{source} is not a text (JSON) file: not UTF-8") from None
    except RecursionError:
        raise error(f"{source} is nested too deeply to read") from None
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise error(f"{source}: a value cannot be read: {str(exc)[:160]}") from None


def load(path: str | Path, error: type[Exception], max_bytes: int, max_depth: int) -> Any:
    """read_bytes, check_bytes and parse of one file; a syntax error is `error` too."""
    raw = read_bytes(path, error, max_bytes)
    check_bytes(raw, str(path), error, max_bytes, max_depth)
    try:
        return parse(raw, str(path), error)
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
