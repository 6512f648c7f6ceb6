"""`make-checkpoint`: write a seeded random-weight checkpoint in the official format (vendor config.json plus
model.safetensors), so tests and demos load exactly what a real user loads."""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..registry import DEFAULT_MODEL, FAMILIES, get_family
from ..spec import SpecError


def register(sub) -> None:
    p = sub.add_parser("make-checkpoint", help="write a random-weight checkpoint (official format) for a spec")
    p.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    p.add_argument("--model", choices=list(FAMILIES), default=DEFAULT_MODEL, help="model family")
    p.add_argument("--preset", choices=sorted({p for f in FAMILIES.values() for p in f.presets}), default="tiny",
                   help="full (the official sizes) or tiny")
    p.add_argument("--set", dest="changes", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec field (JSON value, e.g. num_hidden_layers=2 or sam_global_blocks=[1,3])")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--shard-mb", type=float, default=None, help="write shards of at most this many MB plus an index")
    p.add_argument("--force", action="store_true", help="replace weights already in --out")
    p.set_defaults(func=run)


def parse_changes(items: list[str]) -> dict:
    changes = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            changes[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            changes[key.strip()] = value
    return changes


def run(args) -> int:
    from ..model.checkpoint import save_checkpoint, synthetic_state_dict  # torch import only when used

    family = get_family(args.model)
    spec = family.preset(args.preset)
    if args.changes:
        spec = spec.replace(**parse_changes(args.changes))
    t0 = time.perf_counter()
    state = synthetic_state_dict(spec, seed=args.seed, dtype=args.dtype)
    max_bytes = None if args.shard_mb is None else int(args.shard_mb * 1e6)
    files = save_checkpoint(state, spec, args.out, dtype=args.dtype, max_shard_bytes=max_bytes, overwrite=args.force)
    n = sum(t.numel() for t in state.values())
    size = sum(f.stat().st_size for f in files)
    print(f"wrote {args.out}: {family.label}, {n:,} parameters in {len(state)} tensors, {len(files)} file(s), "
          f"{size / 1e9:.2f} GB ({args.dtype}, seed {args.seed}) in {time.perf_counter() - t0:.1f} s")
    return 0
