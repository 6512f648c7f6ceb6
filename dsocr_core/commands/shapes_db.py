"""`shapes-db`: build the image-shapes SQLite database the app queries."""
from pathlib import Path

from ..tiling import MAX_CROPS, build_image_shapes_db

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "image_shapes.sqlite"


def register(sub) -> None:
    p = sub.add_parser("shapes-db", help="build the image-shapes database (crop counts 1..N)")
    p.add_argument("--out", type=Path, default=DEFAULT_PATH)
    p.add_argument("--max-crops", type=int, default=MAX_CROPS)
    p.set_defaults(func=run)


def run(args) -> int:
    if not 1 <= args.max_crops <= MAX_CROPS:
        raise ValueError(f"--max-crops must lie in 1..{MAX_CROPS}")
    n = build_image_shapes_db(args.out, args.max_crops)
    print(f"wrote {n} rows to {args.out}")
    return 0
