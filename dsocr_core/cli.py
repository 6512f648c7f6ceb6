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
from pathlib import Path

from . import commands


class UserError(Exception):
    """A failure the user can fix (bad argument, missing file); printed as one line, exit status 2."""


def add_model_options(p: argparse.ArgumentParser, seed_flag: str = "--seed") -> None:
    """The options of every command that runs the model: where the weights come from, and how it runs.
    The weights seed lands in `args.weights_seed` whatever its flag is called."""
    from .registry import FAMILIES

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, help="local checkpoint folder (config.json + safetensors; its "
                                                     "config names the model)")
    src.add_argument("--synthetic", choices=sorted({n for f in FAMILIES.values() for n in f.presets}),
                     help="seeded random weights of a preset of --model")
    p.add_argument("--model", choices=list(FAMILIES), default=None,
                   help="model family of --synthetic (default deepseek-ocr); with --checkpoint, a check")
    p.add_argument(seed_flag, dest="weights_seed", type=int, default=0, metavar="N",
                   help="seed of --synthetic weights")
    p.add_argument("--session-mode", choices=["reference", "fast"], default="reference",
                   help="reference: our PyTorch model as written; fast: static cache, grouped experts, CUDA graphs")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"])


def session_from_args(args):
    """The Session the model options describe."""
    from .runtime.session import Session

    return Session.load(checkpoint=args.checkpoint, synthetic=args.synthetic, seed=args.weights_seed,
                        session_mode=args.session_mode, device=args.device, dtype=args.dtype, attn=args.attn,
                        model=args.model)


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
