"""Tiling and token math of every model family (the modes live in dsocr_core/registry.py): the vendor tile-grid
choice (the grid closest to the image's aspect; DeepSeek-OCR: 2..9 tiles under HF, 2..6 under vLLM; DeepSeek-OCR 2:
2..6 of 768 px) and the slot counts.

A view of S x S pixels goes through SAM (patch 16) and the 4x compressor, so it becomes an (S/64) x (S/64) grid
of vision features (1024 -> 256, 640 -> 100, 768 -> 144). In DeepSeek-OCR every feature row gets one
`image_newline` slot; DeepSeek-OCR 2 has none. Each image ends with one `view_seperator` slot.
"""
from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .registry import ModeInfo, get_family, mode_info
from .spec import Mode, SpecError, Workload

HF_CROP_RANGE = (2, 9)  # vendor HF path
VLLM_CROP_RANGE = (2, 6)  # vendor and upstream vLLM paths
FEATURE_STRIDE = 64  # SAM patch 16 x compressor 4: pixels per vision feature along one side
MAX_CROPS = 1000  # largest grid the image-shapes database and the analytic model accept


MODES: dict[str, ModeInfo] = dict(get_family("deepseek-ocr").modes)  # DeepSeek-OCR's modes (image-shapes DB)


def features_per_side(view_pixels: int) -> int:
    """Vision features along one side of a square view: 512->8, 640->10, 1024->16, 1280->20."""
    return view_pixels // FEATURE_STRIDE


def view_slots(grid_w: int, grid_h: int, newlines: bool = True) -> int:
    """Slots of a feature grid grid_h rows by grid_w columns, with one newline after every row (DeepSeek-OCR) or
    none (DeepSeek-OCR 2)."""
    return grid_h * (grid_w + 1) if newlines else grid_h * grid_w


def candidate_grids(min_num: int, max_num: int) -> list[tuple[int, int]]:
    """All (width tiles, height tiles) with min_num <= i*j <= max_num, ordered by tile count as the vendor does."""
    if min_num < 1 or max_num < min_num:
        raise SpecError(f"invalid crop range {min_num}..{max_num}")
    grids = {(i, j) for n in range(min_num, max_num + 1) for i in range(1, n + 1) for j in range(1, n + 1)
             if min_num <= i * j <= max_num}
    return sorted(grids, key=lambda g: g[0] * g[1])


def choose_grid(width: int, height: int, min_num: int = 2, max_num: int = 9, tile_size: int = 640) -> tuple[int, int]:
    """The vendor's choice: the candidate whose i/j is closest to w/h; on an exact tie the later candidate
    wins when the image area exceeds half the candidate's tiled area."""
    if width <= 0 or height <= 0:
        raise SpecError(f"image size must be positive, got {width}x{height}")
    aspect = width / height
    area = width * height
    best, best_diff = (1, 1), math.inf
    for i, j in candidate_grids(min_num, max_num):
        diff = abs(aspect - i / j)
        if diff < best_diff:
            best, best_diff = (i, j), diff
        elif diff == best_diff and area > 0.5 * tile_size * tile_size * i * j:
            best = (i, j)
    return best


def crop_grid(width: int, height: int, mode: Mode | str = "gundam", min_num: int | None = None,
              max_num: int | None = None) -> tuple[int, int]:
    """Tile grid an image gets in a mode: (1, 1) means global view only (untiled modes, or a small page).
    The crop range defaults to the mode's (gundam: the vendor HF 2..9; DeepSeek-OCR 2: 2..6)."""
    info = mode_info(mode)
    min_num = info.crop_range[0] if min_num is None else min_num
    max_num = info.crop_range[1] if max_num is None else max_num
    if width <= 0 or height <= 0:
        raise SpecError(f"image size must be positive, got {width}x{height}")
    if not info.crop_mode:
        return (1, 1)
    if width <= info.tile_size and height <= info.tile_size:
        return (1, 1)
    return choose_grid(width, height, min_num, max_num, info.tile_size)


@dataclass(frozen=True)
class TokenCounts:
    mode: str
    grid: tuple[int, int]  # (width tiles, height tiles); (1, 1) = no local tiles
    global_side: int  # global view pixels
    tile_side: int
    global_features: int  # features of the global view
    local_features: int  # features of all tiles together
    global_slots: int  # global features + their newlines
    local_slots: int  # stitched tile features + their newlines
    image_slots: int  # local + global + 1 separator: the number of <image> positions in the prompt

    @property
    def n_tiles(self) -> int:
        return 0 if self.grid == (1, 1) else self.grid[0] * self.grid[1]

    @property
    def vision_features(self) -> int:
        return self.global_features + self.local_features


def token_counts(mode: Mode | str = "gundam", grid: tuple[int, int] = (1, 1)) -> TokenCounts:
    """Vision features and image slots of one image in `mode` with tile grid `grid` (width, height)."""
    info = mode_info(mode)
    tw, th = grid
    if tw < 1 or th < 1:
        raise SpecError(f"crop grid must be positive, got {tw}x{th}")
    if (tw, th) != (1, 1) and not info.crop_mode:
        raise SpecError(f"mode {mode} does not tile")
    if tw * th > MAX_CROPS:
        raise SpecError(f"crop grid {tw}x{th} has {tw * th} tiles, more than the limit {MAX_CROPS}")
    g = features_per_side(info.base_size)
    t = features_per_side(info.tile_size)
    tiled = (tw, th) != (1, 1)
    local_features = tw * th * t * t if tiled else 0
    local_slots = view_slots(tw * t, th * t, info.newlines) if tiled else 0
    global_slots = view_slots(g, g, info.newlines)
    return TokenCounts(str(mode), (tw, th), info.base_size, info.tile_size, g * g, local_features,
                       global_slots, local_slots, local_slots + global_slots + 1)


def workload_tokens(w: Workload) -> TokenCounts:
    """Token counts of a Workload: explicit crops win, else the vendor choice for its image size."""
    if w.crops is not None:
        grid = w.crops
    elif w.image_size is not None:
        grid = crop_grid(w.image_size[0], w.image_size[1], w.mode, w.min_crops, w.max_crops)
    else:
        grid = (1, 1)
    return token_counts(w.mode, grid)


def sequence_length(w: Workload) -> int:
    """Prompt length: image slots plus the non-image text tokens (BOS included)."""
    return workload_tokens(w).image_slots + w.text_tokens


def images_seq_mask(tokens_before: int, image_slots: int, tokens_after: int) -> np.ndarray:
    """Boolean mask over the prompt, True exactly on image slots. tokens_before includes BOS."""
    if min(tokens_before, image_slots, tokens_after) < 0:
        raise SpecError("token counts must be non-negative")
    return np.concatenate([np.zeros(tokens_before, bool), np.ones(image_slots, bool), np.zeros(tokens_after, bool)])


def slot_layout(counts: TokenCounts) -> list[tuple[str, int]]:
    """The order of an image's slots as (kind, count) runs: local, global, separator. With newlines (DeepSeek-OCR)
    the tiles are stitched into one map and each feature row of `n` features is ('local'|'global', n) followed by
    ('newline', 1); without (DeepSeek-OCR 2) each tile is one run in row-major tile order, then the global view."""
    info = mode_info(counts.mode)
    runs: list[tuple[str, int]] = []
    t = features_per_side(counts.tile_side)
    g = features_per_side(counts.global_side)
    if not info.newlines:
        runs += [("local", t * t)] * counts.n_tiles
        return runs + [("global", g * g), ("separator", 1)]
    if counts.n_tiles:
        for _ in range(counts.grid[1] * t):
            runs += [("local", counts.grid[0] * t), ("newline", 1)]
    for _ in range(g):
        runs += [("global", g), ("newline", 1)]
    runs.append(("separator", 1))
    return runs


def valid_tokens(n_actual: int, width: int, height: int) -> int:
    """Paper eq. 1: tokens of a padded view that carry image content,
    ceil(N_actual * (1 - (max(w,h) - min(w,h)) / max(w,h)))."""
    if width <= 0 or height <= 0:
        raise SpecError(f"image size must be positive, got {width}x{height}")
    long, short = max(width, height), min(width, height)
    return math.ceil(n_actual * (1 - (long - short) / long))


def most_square_grid(n: int) -> tuple[int, int]:
    """The grid of exactly n tiles closest to square, wider than tall: (width tiles, height tiles)."""
    if n < 1:
        raise SpecError(f"crop count must be positive, got {n}")
    h = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return (n // h, h)


def build_image_shapes_db(path: str | Path, max_crops: int = MAX_CROPS, prompt_tokens: int = 10) -> int:
    """Write the image-shapes database: for each Gundam crop count 1..max_crops the most-square grid, the image
    size that tiles to it exactly, slot counts and whether the vendor HF path (2..9 tiles) can produce it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    con.execute("""CREATE TABLE image_shapes (
        crops INTEGER PRIMARY KEY, grid_w INTEGER, grid_h INTEGER, image_w INTEGER, image_h INTEGER,
        local_features INTEGER, global_features INTEGER, image_slots INTEGER, sequence INTEGER,
        vendor_supported INTEGER, vllm_supported INTEGER)""")
    rows = []
    tile = MODES["gundam"].tile_size
    for n in range(1, max_crops + 1):
        gw, gh = most_square_grid(n)
        grid = (gw, gh) if n > 1 else (1, 1)
        c = token_counts("gundam", grid)
        rows.append((n, gw, gh, gw * tile, gh * tile, c.local_features, c.global_features, c.image_slots,
                     c.image_slots + prompt_tokens, int(HF_CROP_RANGE[0] <= n <= HF_CROP_RANGE[1]),
                     int(VLLM_CROP_RANGE[0] <= n <= VLLM_CROP_RANGE[1])))
    con.executemany("INSERT INTO image_shapes VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
    con.commit()
    con.close()
    tmp.replace(path)
    return len(rows)


def query_image_shapes(path: str | Path, min_crops: int = 1, max_crops: int = MAX_CROPS,
                       vendor_only: bool = False) -> list[dict]:
    """Rows of the image-shapes database as dicts, optionally only the vendor-supported 2..9 range."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"image-shapes database not found at {path}; build it with "
                        "`python -m dsocr_core shapes-db`")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    sql = "SELECT * FROM image_shapes WHERE crops BETWEEN ? AND ?" + (" AND vendor_supported=1" if vendor_only else "")
    rows = [dict(r) for r in con.execute(sql + " ORDER BY crops", (min_crops, max_crops))]
    con.close()
    return rows
