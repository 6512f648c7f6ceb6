"""Page image + prompt -> model inputs, with the rules of the vendor's HF path (below).

Pixels: EXIF transpose, RGB (16-bit, 32-bit and float images reduced to 8 bits faithfully, not clipped:
image_modes.py); global view padded to base_size with (127, 127, 127), bicubic, centred (base, large,
gundam) or resized directly (tiny, small); Gundam tiles: the whole image resized to (tile*i, tile*j) bicubic and
cut into i*j tiles row-major; ToTensor then normalise with mean = std = 0.5.

Text: the plain template (the model input is exactly the prompt), split on `<image>`, each piece encoded without
special tokens, the image's slots inserted as copies of the image token id, BOS prepended, no EOS.

Every bad image (empty, not an image, truncated, zero-size, too many pixels) raises ImageError with one line;
every bad prompt raises PromptError. Both are ValueErrors.
"""
from __future__ import annotations

import io
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image, ImageOps

from ..tiling import TokenCounts, crop_grid, mode_info, token_counts
from .image_limits import MAX_FILE_BYTES, MAX_PIXELS, pixel_limit_message  # noqa: F401 - re-exported
from .image_modes import to_rgb
from .tokenizer import BOS_ID, IMAGE_TOKEN, IMAGE_TOKEN_ID, Tokenizer, load_tokenizer

PAD_COLOR = (127, 127, 127)  # int(0.5 * 255) per channel: the vendor's fill for padded views
MEAN = STD = 0.5
DEFAULT_PROMPT = "<image>\n<|grounding|>Convert the document to markdown."

ImageSource = Any  # str | os.PathLike | bytes | bytearray | memoryview | binary file object | PIL.Image.Image


class ImageError(ValueError):
    """An image that cannot be used (empty, not an image, truncated, zero-size, too large). One-line message."""


class PromptError(ValueError):
    """A prompt that does not fit the image(s) given, or batch rows of different lengths."""


# ----------------------------------------------------------------------------------------------------- images
def _describe(source: ImageSource) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"image data ({len(source)} bytes)"
    return getattr(source, "name", None) or type(source).__name__


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def load_image(source: ImageSource, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Open a page image the way the vendor does: decode fully, apply the EXIF orientation, convert to RGB
    (a high-bit-depth image reduced to 8 bits, where the vendor's convert would clip it white).

    Accepts a path, bytes, a binary file object or a PIL image. Multi-frame files give their first frame.
    Raises ImageError for anything unusable."""
    what = _describe(source)
    if isinstance(source, Image.Image):
        image = source
        _check_size(image.size, what, max_pixels)
        try:
            image.load()
            image = ImageOps.exif_transpose(image)
            return to_rgb(image)
        except Exception as exc:  # noqa: BLE001
            raise ImageError(f"{what}: cannot use this image: {_one_line(exc)}") from None
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ImageError(f"image not found: {path}")
        size = path.stat().st_size
        if size == 0:
            raise ImageError(f"{path}: the file is empty")
        if size > MAX_FILE_BYTES:
            raise ImageError(f"{path}: {size / 2**20:.0f} MiB is larger than the {MAX_FILE_BYTES // 2**20} MiB limit")
        data = path.read_bytes()
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif hasattr(source, "read"):
        data = source.read()
        if not isinstance(data, (bytes, bytearray)):
            raise ImageError(f"{what}: expected a binary file, got {type(data).__name__}")
        data = bytes(data)
    else:
        raise ImageError(f"cannot read an image from a {type(source).__name__}")
    if not data:
        raise ImageError(f"{what}: no image data (empty)")
    if len(data) > MAX_FILE_BYTES:
        raise ImageError(f"{what}: larger than the {MAX_FILE_BYTES // 2**20} MiB limit")
    return _decode(data, what, max_pixels)


def _check_size(size: tuple[int, int], what: str, max_pixels: int) -> None:
    w, h = size
    if w <= 0 or h <= 0:
        raise ImageError(f"{what}: the image has zero size ({w}x{h})")
    if w * h > max_pixels:
        raise ImageError(f"{what}: {pixel_limit_message(w * h, (w, h), max_pixels)}")


def _bomb(what: str, exc: BaseException, max_pixels: int) -> ImageError:
    """Pillow's decompression-bomb refusal, in the one pixel-limit message (its text names the pixel count)."""
    found = re.search(r"Image size \((\d+) pixels\)", str(exc))
    if found:  # Pillow's warning is an error here, so its limit applies where it is below ours
        limit = min(max_pixels, Image.MAX_IMAGE_PIXELS or max_pixels)
        return ImageError(f"{what}: {pixel_limit_message(int(found.group(1)), None, limit)}")
    return ImageError(f"{what}: refused as a possible decompression bomb ({_one_line(exc)})")


def _decode(data: bytes, what: str, max_pixels: int) -> Image.Image:
    with warnings.catch_warnings():
        # PIL warns (DecompressionBombWarning) before it refuses (DecompressionBombError); both become ImageError
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise _bomb(what, exc, max_pixels) from None
        except Exception:  # noqa: BLE001 - PIL raises UnidentifiedImageError, OSError, SyntaxError, ...
            raise ImageError(f"{what}: not a readable image file") from None
        _check_size(image.size, what, max_pixels)  # from the header, before any pixel is decoded
        try:
            image.load()
            image = ImageOps.exif_transpose(image)
            rgb = to_rgb(image)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise _bomb(what, exc, max_pixels) from None
        except Exception as exc:  # noqa: BLE001 - truncated or corrupt data
            raise ImageError(f"{what}: the image data is truncated or corrupt ({_one_line(exc)})") from None
    _check_size(rgb.size, what, max_pixels)
    return rgb


def global_view(image: Image.Image, mode: str = "gundam") -> Image.Image:
    """The global view: padded to base_size keeping the aspect (base, large, gundam) or resized (tiny, small)."""
    info = mode_info(mode)
    side = info.base_size
    if info.pad:
        return ImageOps.pad(image, (side, side), method=Image.Resampling.BICUBIC, color=PAD_COLOR,
                            centering=(0.5, 0.5))
    return image.resize((side, side), Image.Resampling.BICUBIC)


def tile_views(image: Image.Image, grid: tuple[int, int], tile: int) -> list[Image.Image]:
    """Resize the whole image to (tile*i, tile*j) bicubic and cut i*j tiles row by row."""
    tw, th = grid
    resized = image.resize((tile * tw, tile * th), Image.Resampling.BICUBIC)
    return [resized.crop((c * tile, r * tile, (c + 1) * tile, (r + 1) * tile)) for r in range(th) for c in range(tw)]


def to_tensor(views: Sequence[Image.Image], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """PIL RGB views -> [N, 3, H, W] normalised to [-1, 1] ((x/255 - 0.5) / 0.5), computed in float32."""
    arr = np.stack([np.asarray(v, dtype=np.uint8) for v in views])  # [N, H, W, 3]
    t = torch.from_numpy(arr).permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
    return t.sub_(MEAN).div_(STD).to(dtype).contiguous()


@dataclass
class ImageViews:
    """One image's pixels as the model takes them."""

    crops: torch.Tensor  # [n_tiles, 3, tile, tile], or zeros [1, 3, base, base] when untiled (vendor placeholder)
    global_view: torch.Tensor  # [1, 3, base, base]
    grid: tuple[int, int]  # (width tiles, height tiles); (1, 1) = untiled
    counts: TokenCounts
    size: tuple[int, int]  # original (width, height) after the EXIF transpose


def image_views(image: Image.Image, mode: str = "gundam", min_crops: int | None = None,
                max_crops: int | None = None, dtype: torch.dtype = torch.float32) -> ImageViews:
    """Crops and global view of an already loaded RGB image."""
    info = mode_info(mode)
    w, h = image.size
    grid = crop_grid(w, h, mode, min_crops, max_crops)
    counts = token_counts(mode, grid)
    glob = to_tensor([global_view(image, mode)], dtype)
    if grid != (1, 1):
        crops = to_tensor(tile_views(image, grid, info.tile_size), dtype)
    else:
        crops = torch.zeros(1, 3, info.base_size, info.base_size, dtype=dtype)
    return ImageViews(crops, glob, grid, counts, (w, h))


# ----------------------------------------------------------------------------------------------------- text
def build_input_ids(prompt: str, tokenizer: Tokenizer, image_slots: int | None) -> list[int]:
    """BOS + text pieces (no special tokens added) with `image_slots` image ids where `<image>` stands.
    image_slots None means no image is given: then the prompt must not contain `<image>`."""
    if not isinstance(prompt, str):
        raise PromptError(f"the prompt must be text, got {type(prompt).__name__}")
    pieces = prompt.split(IMAGE_TOKEN)
    tags = len(pieces) - 1
    if image_slots is None:
        if tags:
            raise PromptError(f"the prompt has {tags} <image> tag(s) but no image was given")
        return [BOS_ID, *tokenizer.encode(prompt)]
    if tags == 0:
        raise PromptError("an image was given but the prompt has no <image> tag "
                          "(e.g. '<image>\\n<|grounding|>Convert the document to markdown.')")
    if tags > 1:
        raise PromptError(f"the prompt has {tags} <image> tags for one image; use exactly one")
    before, after = pieces
    return [BOS_ID, *tokenizer.encode(before), *([IMAGE_TOKEN_ID] * image_slots), *tokenizer.encode(after)]


# ----------------------------------------------------------------------------------------------------- inputs
@dataclass
class PreparedInputs:
    """What the model's forward takes, plus what the UI and the cost model want to know about it."""

    input_ids: torch.Tensor  # [B, T] long
    images: list[tuple[torch.Tensor, torch.Tensor]]  # per row (crops, global); empty for text-only rows
    images_seq_mask: torch.Tensor  # [B, T] bool, True exactly on image slots
    images_spatial_crop: torch.Tensor  # [B, 2] long, (width tiles, height tiles); (0, 0) for text-only rows
    mode: str
    counts: list[TokenCounts | None]  # per row; None for a text-only row
    image_sizes: list[tuple[int, int] | None]  # per row, original (width, height); None for synthetic/text-only
    prompts: list[str | None] = field(default_factory=list)  # None for synthetic rows
    synthetic: bool = False

    @property
    def batch(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def image_slots(self) -> int:
        """Image slots in one row (all rows have the same count)."""
        return int(self.images_seq_mask[0].sum())

    @property
    def text_tokens(self) -> int:
        """Non-image tokens of one row, BOS included (Workload.text_tokens)."""
        return self.seq_len - self.image_slots

    @property
    def token_counts(self) -> TokenCounts | None:
        return self.counts[0] if self.counts else None

    @property
    def image_size(self) -> tuple[int, int] | None:
        return self.image_sizes[0] if self.image_sizes else None

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "PreparedInputs":
        """A copy on `device`, pixel tensors cast to `dtype` (ids and masks keep theirs)."""
        def px(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype) if dtype is not None else t.to(device=device)

        return PreparedInputs(self.input_ids.to(device), [(px(c), px(g)) for c, g in self.images],
                              self.images_seq_mask.to(device), self.images_spatial_crop.to(device), self.mode,
                              list(self.counts), list(self.image_sizes), list(self.prompts), self.synthetic)

    def rows(self, start: int, stop: int) -> "PreparedInputs":
        """Batch rows start..stop-1 (their padded width kept: each row's work is what it is in the whole batch)."""
        if not 0 <= start < stop <= self.batch:
            raise ValueError(f"rows {start}..{stop - 1} are not within the batch of {self.batch}")
        picked = slice(start, stop)
        return PreparedInputs(self.input_ids[picked], self.images[picked] if self.images else [],
                              self.images_seq_mask[picked], self.images_spatial_crop[picked], self.mode,
                              self.counts[picked], self.image_sizes[picked], self.prompts[picked], self.synthetic)

    def summary(self) -> dict:
        """JSON-friendly description (no tensors)."""
        c = self.token_counts
        return {
            "mode": self.mode, "batch": self.batch, "sequence": self.seq_len, "image_slots": self.image_slots,
            "text_tokens": self.text_tokens,
            "grids": [list(map(int, g)) for g in self.images_spatial_crop.tolist()],
            "image_sizes": [list(s) if s else None for s in self.image_sizes],
            "tiles": c.n_tiles if c else 0,
            "vision_features": c.vision_features if c else 0,
            "pixel_dtype": str(self.images[0][1].dtype).replace("torch.", "") if self.images else None,
            "synthetic": self.synthetic,
        }


def _as_list(x, name: str) -> list:
    if isinstance(x, (list, tuple)):
        if not x:
            raise PromptError(f"no {name} given")
        return list(x)
    return [x]


def prepare_inputs(images: ImageSource | Sequence[ImageSource] | None, prompts: str | Sequence[str] = DEFAULT_PROMPT,
                   tokenizer: Tokenizer | None = None, mode: str = "gundam", min_crops: int | None = None,
                   max_crops: int | None = None, dtype: torch.dtype = torch.float32, batch: int = 1,
                   max_pixels: int = MAX_PIXELS) -> PreparedInputs:
    """Images and prompts -> PreparedInputs, one row per (image, prompt) pair.

    A single image or a single prompt is paired with every element of the other list; `batch` repeats the
    resulting rows. All rows must come out the same length (the model takes no padding). images=None builds
    text-only rows (then no prompt may contain `<image>`). The tokenizer defaults to the labelled fallback."""
    if batch < 1:
        raise PromptError(f"batch must be at least 1, got {batch}")
    mode_info(mode)  # unknown mode -> SpecError before any decoding
    tokenizer = tokenizer or load_tokenizer(None)
    prompt_list = _as_list(prompts, "prompt")
    image_list = [None] if images is None else _as_list(images, "image")
    if len(image_list) > 1 and len(prompt_list) > 1 and len(image_list) != len(prompt_list):
        raise PromptError(f"{len(image_list)} images but {len(prompt_list)} prompts; give one prompt, "
                          "one image, or as many of each")
    n = max(len(image_list), len(prompt_list))
    image_list = image_list * n if len(image_list) == 1 else image_list
    prompt_list = prompt_list * n if len(prompt_list) == 1 else prompt_list
    if any(img is None for img in image_list) and not all(img is None for img in image_list):
        raise PromptError("mixing rows with and without an image in one batch is not supported")

    rows_ids, rows_images, rows_grid, rows_counts, rows_sizes = [], [], [], [], []
    cache: dict[int, ImageViews] = {}  # the same source object repeated (broadcast) is decoded once
    for img, prompt in zip(image_list, prompt_list):
        if img is None:
            rows_ids.append(build_input_ids(prompt, tokenizer, None))
            rows_grid.append((0, 0))
            rows_counts.append(None)
            rows_sizes.append(None)
            continue
        build_input_ids(prompt, tokenizer, 0)  # a prompt without exactly one <image> fails before any decoding
        key = id(img)
        if key not in cache:
            cache[key] = image_views(load_image(img, max_pixels), mode, min_crops, max_crops, dtype)
        v = cache[key]
        rows_ids.append(build_input_ids(prompt, tokenizer, v.counts.image_slots))
        rows_images.append((v.crops, v.global_view))
        rows_grid.append(v.grid)
        rows_counts.append(v.counts)
        rows_sizes.append(v.size)

    lengths = sorted({len(r) for r in rows_ids})
    if len(lengths) > 1:
        raise PromptError(f"batch rows have different lengths {lengths} (different prompts or tile grids); "
                          "the model takes rows of one length only, without padding")
    ids = torch.tensor(rows_ids, dtype=torch.long)
    mask = ids == IMAGE_TOKEN_ID
    if len(rows_images) and not torch.equal(mask.sum(1), torch.tensor([c.image_slots for c in rows_counts])):
        raise PromptError("the prompt text itself encodes to the image token id; remove it from the text")
    out = PreparedInputs(ids, rows_images, mask, torch.tensor(rows_grid, dtype=torch.long), str(mode),
                         rows_counts, rows_sizes, list(prompt_list))
    return repeat_rows(out, batch) if batch > 1 else out


def repeat_rows(inputs: PreparedInputs, times: int) -> PreparedInputs:
    """Every row repeated `times` times (the pixel tensors are shared, not copied)."""
    if times < 1:
        raise PromptError(f"batch must be at least 1, got {times}")
    return PreparedInputs(inputs.input_ids.repeat(times, 1), inputs.images * times,
                          inputs.images_seq_mask.repeat(times, 1), inputs.images_spatial_crop.repeat(times, 1),
                          inputs.mode, inputs.counts * times, inputs.image_sizes * times, inputs.prompts * times,
                          inputs.synthetic)


# ----------------------------------------------------------------------------------------------------- synthetic
def synthetic_inputs(mode: str = "gundam", grid: tuple[int, int] = (1, 1), text_tokens: int = 10, batch: int = 1,
                     seed: int = 0, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                     image_size: tuple[int, int] | None = None, min_crops: int | None = None,
                     max_crops: int | None = None) -> PreparedInputs:
    """Inputs of a target shape without any image file, for measured sweeps.

    Pixels are uniform in [-1, 1] and text ids uniform over the ordinary vocabulary (3 .. 128814: no BOS, EOS, pad
    or special token), all from `seed` (drawn on the CPU, so every device gets the same values). Layout like the
    grounding prompt: BOS, the image slots, then text_tokens - 1 text ids (text_tokens counts BOS, as
    Workload.text_tokens does). image_size, when given, picks the grid with the vendor rule instead of `grid`.
    Each row gets its own pixels and text."""
    info = mode_info(mode)
    if text_tokens < 1:
        raise PromptError(f"text_tokens counts BOS and must be at least 1, got {text_tokens}")
    if batch < 1:
        raise PromptError(f"batch must be at least 1, got {batch}")
    if image_size is not None:
        grid = crop_grid(image_size[0], image_size[1], mode, min_crops, max_crops)
    grid = (int(grid[0]), int(grid[1]))
    counts = token_counts(mode, grid)
    gen = torch.Generator().manual_seed(seed)

    def pixels(n: int, side: int) -> torch.Tensor:
        return (torch.rand(n, 3, side, side, generator=gen) * 2 - 1).to(dtype)

    rows_ids, rows_images = [], []
    for _ in range(batch):
        text = torch.randint(3, IMAGE_TOKEN_ID, (text_tokens - 1,), generator=gen).tolist()
        rows_ids.append([BOS_ID, *([IMAGE_TOKEN_ID] * counts.image_slots), *text])
        crops = pixels(counts.n_tiles, info.tile_size) if counts.n_tiles else torch.zeros(
            1, 3, info.base_size, info.base_size, dtype=dtype)
        rows_images.append((crops, pixels(1, info.base_size)))
    ids = torch.tensor(rows_ids, dtype=torch.long)
    out = PreparedInputs(ids, rows_images, ids == IMAGE_TOKEN_ID, torch.tensor([grid] * batch, dtype=torch.long),
                         str(mode), [counts] * batch, [None] * batch, [None] * batch, synthetic=True)
    return out.to(device) if device is not None else out


def synthetic_for_workload(workload, seed: int = 0, device: torch.device | str | None = None) -> PreparedInputs:
    """synthetic_inputs for a spec.Workload (mode, crops or image_size, text_tokens, batch, dtype)."""
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[workload.dtype]
    if workload.crops is not None:
        return synthetic_inputs(workload.mode, workload.crops, workload.text_tokens, workload.batch, seed, dtype,
                                device)
    return synthetic_inputs(workload.mode, (1, 1), workload.text_tokens, workload.batch, seed, dtype, device,
                            image_size=workload.image_size, min_crops=workload.min_crops,
                            max_crops=workload.max_crops)

