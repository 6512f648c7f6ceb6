"""`python -m dsocr_core <command>`: headless access to the same functions the pages call.

Each command lives in its own module under dsocr_core/commands/ and exposes `register(subparsers)`, which adds
its parser and sets `func(args) -> int`. Expected failures (bad input, missing files) end with one line on stderr
and exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import commands


class UserError(Exception):
    """A failure the user can fix (bad argument, missing file); printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dsocr_core", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # lets a command print the exact line that re-runs it (e.g. under nsys)
    from .spec import SpecError

    try:
        return int(args.func(args) or 0)
    except (UserError, SpecError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
