"""The limits on a page image and the one message for an image over the pixel limit (torch-free: the dashboard's
upload checks import it without loading the model's dependencies)."""
from __future__ import annotations

MAX_PIXELS = 64_000_000  # larger images are refused as possible decompression bombs
MAX_FILE_BYTES = 256 * 1024 * 1024


def pixel_limit_message(pixels: int, size: tuple[int, int] | None = None, max_pixels: int = MAX_PIXELS,
                        what: str = "page image") -> str:
    """The one message for an image over the pixel limit, whatever refused it: our size check (from the header,
    before decoding), Pillow's own decompression-bomb check (which fires first above its 89,478,485-pixel default,
    with a text of its own) or a PDF page's size at the rendering resolution. The CLI, the dataset runs, the
    uploads and the dashboard all show this text."""
    dims = f"{size[0]:,} x {size[1]:,} = " if size else ""
    return (f"{dims}{pixels / 1e6:,.0f} megapixels is over the {max_pixels / 1e6:,.0f}-megapixel limit for a {what} "
            "(refused before decoding, as a possible decompression bomb); downscale the page")
