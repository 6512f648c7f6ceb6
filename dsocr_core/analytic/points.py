"""Sweep points: a workload grid as numpy arrays, never one object per point.

`Points` holds, per point, the crop grid, text tokens, batch and decode steps, plus the categorical settings shared
by all its points (mode, dtype, attention, logits). Token counts come from tiling.token_counts, called once per
DISTINCT crop grid (and tiling.crop_grid once per distinct image size), then spread back with numpy indexing, so the
sweep and the single-point API use the same token math. A single workload is a sweep of one point.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec import DTYPE_BYTES, SpecError, Workload
from ..tiling import MAX_CROPS, crop_grid, mode_info, token_counts

# Limits past which an input cannot describe a real run (or would exhaust memory); the CLI reports them in one line.
MAX_BATCH = 1 << 16
MAX_TEXT_TOKENS = 10_000_000
MAX_DECODE_STEPS = 10_000_000
MAX_IMAGE_SIDE = 1 << 17
MAX_POINTS = 20_000_000
ATTN_IMPLS = ("eager", "sdpa", "flash")
LOGITS_MODES = ("all", "last")


def _int_array(name: str, values, low: int, high: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise SpecError(f"{name} must be whole numbers")
        arr = arr.astype(np.int64)
    elif arr.dtype.kind not in "iu":
        raise SpecError(f"{name} must be integers, got {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < low or arr.max() > high):
        bad = arr[(arr < low) | (arr > high)].flat[0]
        raise SpecError(f"{name} must lie in {low}..{high}, got {bad}")
    return arr


def distinct_tuples(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(index of the first point of each distinct key tuple, inverse map back to every point), the tuples in
    lexicographic order: np.unique over the stacked keys' columns (keys of any shape are flattened and must have
    one size). Non-negative integer keys are packed into one int64 first (the first key most significant, so the
    order is the same), which np.unique sorts as plain numbers: sorting the stacked columns as tuples took about
    half of an analytic sweep with prediction on."""
    flat = [np.asarray(k).reshape(-1) for k in keys]
    if len({k.size for k in flat}) > 1:  # ravel_multi_index would broadcast them
        raise ValueError(f"keys differ in size: {[k.size for k in flat]}")
    ints = all(np.issubdtype(k.dtype, np.integer) for k in flat)
    sizes = [int(k.max()) + 1 if k.size else 1 for k in flat]
    if ints and all(k.size == 0 or k.min() >= 0 for k in flat) and float(np.prod(sizes, dtype=float)) < 2.0 ** 62:
        packed = np.ravel_multi_index(tuple(k.astype(np.int64) for k in flat), sizes)
        _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(np.stack(flat), axis=1, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _unique_map(a: np.ndarray, b: np.ndarray, fn) -> tuple[np.ndarray, ...]:
    """Apply fn(x, y) -> tuple of numbers once per distinct (x, y) pair and spread the results back."""
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    first, inverse = distinct_tuples([a_flat, b_flat])
    table = np.array([fn(int(a_flat[i]), int(b_flat[i])) for i in first], dtype=np.int64).reshape(len(first), -1)
    return tuple(table[inverse, j].reshape(a.shape) for j in range(table.shape[1]))


@dataclass(frozen=True, eq=False)
class Points:
    """Arrays of equal shape (one entry per sweep point) plus settings shared by all points."""

    crops_w: np.ndarray  # width tiles; (1, 1) = global view only
    crops_h: np.ndarray  # height tiles
    text_tokens: np.ndarray  # non-image prompt tokens, BOS included
    batch: np.ndarray  # images (= sequences) per forward call
    decode_steps: np.ndarray  # decode steps after prefill
    n_tiles: np.ndarray  # local tiles per image (0 when untiled)
    image_slots: np.ndarray  # <image> positions per prompt
    mode: str = "gundam"
    dtype: str = "bfloat16"
    attn: str = "sdpa"
    logits: str = "all"
    image_w: np.ndarray | None = None  # original page size when the grid came from it
    image_h: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.batch.size)

    @property
    def sequence(self) -> np.ndarray:
        """Prompt length per row: image slots + text tokens."""
        return self.image_slots + self.text_tokens

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @classmethod
    def build(cls, *, mode: str = "gundam", crops=None, image=None, text_tokens=10, batch=1, decode_steps=0,
              min_crops: int | None = None, max_crops: int | None = None, dtype: str = "bfloat16",
              attn: str = "sdpa", logits: str = "all") -> "Points":
        """Points from broadcastable arrays. `crops` and `image` are (..., 2) arrays of (width, height) pairs;
        `crops` wins; neither means global view only; the crop range defaults to the mode's. Raises SpecError on
        impossible input."""
        info = mode_info(mode)
        min_crops = info.crop_range[0] if min_crops is None else min_crops
        max_crops = info.crop_range[1] if max_crops is None else max_crops
        if dtype not in DTYPE_BYTES:
            raise SpecError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
        if attn not in ATTN_IMPLS:
            raise SpecError(f"unknown attention {attn!r}; choose one of {', '.join(ATTN_IMPLS)}")
        if logits not in LOGITS_MODES:
            raise SpecError(f"unknown logits mode {logits!r}; choose all or last")
        if not 1 <= min_crops <= max_crops <= MAX_CROPS:
            raise SpecError(f"crop range must satisfy 1 <= min_crops <= max_crops <= {MAX_CROPS}, "
                            f"got {min_crops}..{max_crops}")
        text = _int_array("text tokens", text_tokens, 1, MAX_TEXT_TOKENS)
        bat = _int_array("batch", batch, 1, MAX_BATCH)
        steps = _int_array("decode steps", decode_steps, 0, MAX_DECODE_STEPS)
        image_w = image_h = None
        if crops is not None:
            c = _int_array("crop grid", crops, 1, MAX_CROPS)
            if c.shape[-1:] != (2,):
                raise SpecError("crops must be (width tiles, height tiles) pairs")
            cw, ch = c[..., 0], c[..., 1]
            if np.any(cw * ch > MAX_CROPS):
                i = int(np.argmax(cw * ch > MAX_CROPS))
                raise SpecError(f"crop grid {cw.flat[i]}x{ch.flat[i]} has {cw.flat[i] * ch.flat[i]} tiles, "
                                f"past the limit of {MAX_CROPS}")
        elif image is not None:
            im = _int_array("image size", image, 1, MAX_IMAGE_SIDE)
            if im.shape[-1:] != (2,):
                raise SpecError("image sizes must be (width, height) pairs")
            image_w, image_h = im[..., 0], im[..., 1]
            cw, ch = _unique_map(image_w, image_h, lambda w, h: crop_grid(w, h, mode, min_crops, max_crops))
        else:
            cw = ch = np.ones((), np.int64)
        if not info.crop_mode and (np.any(cw != 1) or np.any(ch != 1)):
            raise SpecError(f"mode {mode} does not tile; crops apply to crop modes only")
        shape = np.broadcast_shapes(cw.shape, ch.shape, text.shape, bat.shape, steps.shape)
        size = int(np.prod(shape, dtype=np.int64))
        if size > MAX_POINTS:
            raise SpecError(f"a grid of {size} points is past the limit of {MAX_POINTS}")
        cw, ch, text, bat, steps = (np.broadcast_to(a, shape).ravel() for a in (cw, ch, text, bat, steps))

        def counts(w: int, h: int) -> tuple[int, int]:
            tc = token_counts(mode, (w, h))
            return tc.n_tiles, tc.image_slots

        n_tiles, slots = _unique_map(cw, ch, counts)
        if image_w is not None:
            image_w, image_h = (np.broadcast_to(a, shape).ravel() for a in (image_w, image_h))
        return cls(cw, ch, text, bat, steps, n_tiles, slots, mode, dtype, attn, logits, image_w, image_h)

    @classmethod
    def grid(cls, *, mode: str = "gundam", crops=None, images=None, text_tokens=(10,), batch=(1,),
             decode_steps=(0,), **settings) -> "Points":
        """The cartesian product of value lists (crop grids or image sizes x text tokens x batch x steps),
        laid out with numpy broadcasting: crops vary slowest, decode steps fastest."""
        pairs = crops if crops is not None else images
        n_pairs = 1 if pairs is None else len(pairs)
        lists = [np.asarray(text_tokens), np.asarray(batch), np.asarray(decode_steps)]
        if any(a.ndim != 1 or a.size == 0 for a in lists) or n_pairs == 0:
            raise SpecError("every sweep axis needs at least one value")
        total = n_pairs * np.prod([a.size for a in lists], dtype=np.int64)
        if total > MAX_POINTS:
            raise SpecError(f"a grid of {total} points is past the limit of {MAX_POINTS}")
        ix = np.indices((n_pairs, *[a.size for a in lists])).reshape(4, -1)
        kw = dict(text_tokens=lists[0][ix[1]], batch=lists[1][ix[2]], decode_steps=lists[2][ix[3]])
        if pairs is not None:
            arr = np.asarray(pairs)
            if arr.ndim != 2 or arr.shape[1] != 2:
                raise SpecError("crop grids and image sizes must be (width, height) pairs")
            kw["crops" if crops is not None else "image"] = arr[ix[0]]
        return cls.build(mode=mode, **kw, **settings)

    @classmethod
    def from_workload(cls, w: Workload) -> "Points":
        """A single Workload as a sweep of one point."""
        return cls.build(mode=w.mode, crops=None if w.crops is None else [w.crops],
                         image=None if w.image_size is None or w.crops is not None else [w.image_size],
                         text_tokens=[w.text_tokens], batch=[w.batch], decode_steps=[w.decode_steps],
                         min_crops=w.min_crops, max_crops=w.max_crops, dtype=w.dtype, attn=w.attn, logits=w.logits)

    def take(self, idx: np.ndarray) -> "Points":
        """The points at positions `idx` (same settings)."""
        pick = lambda a: None if a is None else a[idx]  # noqa: E731
        return Points(self.crops_w[idx], self.crops_h[idx], self.text_tokens[idx], self.batch[idx],
                      self.decode_steps[idx], self.n_tiles[idx], self.image_slots[idx], self.mode, self.dtype,
                      self.attn, self.logits, pick(self.image_w), pick(self.image_h))

    def columns(self) -> dict[str, np.ndarray]:
        """Per-point inputs and token counts, for tables and exports."""
        out = {"mode": np.full(self.size, self.mode), "crops_w": self.crops_w, "crops_h": self.crops_h,
               "n_tiles": self.n_tiles, "text_tokens": self.text_tokens, "batch": self.batch,
               "decode_steps": self.decode_steps, "image_slots": self.image_slots, "sequence": self.sequence}
        if self.image_w is not None:
            out["image_w"], out["image_h"] = self.image_w, self.image_h
        return out
