"""`python -m dsocr_core <command>`: headless access to the same functions the pages call.

Each command lives in its own module under dsocr_core/commands/ and exposes `register(subparsers)`, which adds
its parser and sets `func(args) -> int`. Expected failures (bad input, missing files) end with one line on stderr
and exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from . import commands
from .engines import ENGINES, options_help, parse_options


class UserError(Exception):
    """A failure the user can fix (bad argument, missing file); printed as one line, exit status 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `kill` and `timeout` send), raised where the program is, so that everything Ctrl-C cleans up
    (a sweep's temporary file, Ray workers, the run id printed for a resume) is cleaned up for it too."""


@contextmanager
def sigterm_as_interrupt():
    """While inside, SIGTERM raises Terminated in the main thread; a second SIGTERM during the clean-up ends the
    process at once, as SIGTERM did before. Does nothing outside the main thread (signals cannot be set there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    p.add_argument("--session-mode", choices=list(ENGINES), default="reference",
                   help="; ".join(f"{k.name}: {k.help}" for k in ENGINES.values()))
    p.add_argument("--engine-options", metavar="JSON", help=options_help())
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"])


def add_mode_options(p: argparse.ArgumentParser) -> None:
    """--mode and the crop range of the commands that prepare real pages; defaults come from the model (registry)."""
    from .registry import FAMILIES, all_modes

    defaults = ", ".join(f"{f.name}: {f.default_mode}" for f in FAMILIES.values())
    tiled = {m: i for f in FAMILIES.values() for m, i in f.modes.items() if i.crop_mode}
    ranges = ", ".join(f"{m} {i.crop_range[0]}..{i.crop_range[1]}" for m, i in tiled.items())
    p.add_argument("--mode", choices=all_modes(), default=None, help=f"tiling mode (default: the model's; {defaults})")
    p.add_argument("--min-crops", type=int, default=None, help=f"fewest tiles (default: the mode's; {ranges})")
    p.add_argument("--max-crops", type=int, default=None, help="most tiles (default: the mode's)")


def family_from_args(args):
    """The model family a command runs, known before any weight loads: --model, else the --checkpoint's
    config.json, else the default model."""
    from .registry import family_of_config, get_family
    from .spec import SpecError, read_config_json

    if getattr(args, "model", None) is not None or getattr(args, "checkpoint", None) is None:
        return get_family(getattr(args, "model", None))
    config = Path(args.checkpoint) / "config.json"
    if not config.exists():
        raise UserError(f"{args.checkpoint} has no config.json; is it a checkpoint folder?")
    try:  # size and depth bounded before parsing, as every config read
        raw = read_config_json(config)[1]
    except SpecError as exc:
        raise UserError(f"not readable JSON: {exc}") from None
    return family_of_config(raw) if isinstance(raw, dict) else get_family()  # the loader names a non-object


def resolve_mode(args, family) -> tuple[str, int, int]:
    """(mode, min crops, max crops) of a command: the family's default mode and the mode's crop range where not
    given; a mode of another family is an error naming this family's modes."""
    mode = args.mode or family.default_mode
    if mode not in family.modes:
        raise UserError(f"--mode {mode} is not a {family.label} mode; choose one of {', '.join(family.modes)}")
    low, high = family.modes[mode].crop_range
    return mode, args.min_crops or low, args.max_crops or high


def session_from_args(args):
    """The Session the model options describe."""
    from .runtime.session import Session

    return Session.load(checkpoint=args.checkpoint, synthetic=args.synthetic, seed=args.weights_seed,
                        session_mode=args.session_mode, device=args.device, dtype=args.dtype, attn=args.attn,
                        model=args.model, engine_options=parse_options(getattr(args, "engine_options", None)))


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
        with sigterm_as_interrupt():
            return int(args.func(args) or 0)
    except (UserError, SpecError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    except Terminated:
        print("terminated (SIGTERM); cleaned up as after Ctrl-C", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
