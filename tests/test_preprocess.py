import io

import numpy as np
import pytest
import torch
from PIL import Image

from dsocr_core.runtime.inputs import (
    DEFAULT_PROMPT,
    ImageError,
    PromptError,
    load_image,
    prepare_inputs,
    synthetic_for_workload,
    synthetic_inputs,
)
from dsocr_core.spec import SpecError, Workload
from dsocr_core.tiling import token_counts
from dsocr_core.runtime.tokenizer import FallbackTokenizer

PAD_VALUE = 127 / 255 * 2 - 1  # -0.0039...
IMG = 128815


def png_bytes(image: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("mode,size,grid,crops_shape,global_side,slots", [
    ("tiny", (800, 600), (1, 1), (1, 3, 512, 512), 512, 73),
    ("small", (800, 600), (1, 1), (1, 3, 640, 640), 640, 111),
    ("base", (800, 600), (1, 1), (1, 3, 1024, 1024), 1024, 273),
    ("large", (800, 600), (1, 1), (1, 3, 1280, 1280), 1280, 421),
    ("gundam", (600, 500), (1, 1), (1, 3, 1024, 1024), 1024, 273),  # <= 640 both sides: no tiles
    ("gundam", (640, 640), (1, 1), (1, 3, 1024, 1024), 1024, 273),
    ("gundam", (1280, 1280), (2, 2), (4, 3, 640, 640), 1024, 693),
    ("gundam", (1920, 1080), (4, 2), (8, 3, 640, 640), 1024, 1093),
    ("gundam", (640, 832), (2, 3), (6, 3, 640, 640), 1024, 903),  # the vendor example page
    ("gundam-m", (2048, 1024), (2, 1), (2, 3, 1024, 1024), 1280, 20 * 21 + 16 * 33 + 1),
])
def test_grids_and_shapes(mode, size, grid, crops_shape, global_side, slots):
    image = Image.new("RGB", size, (200, 210, 220))
    p = prepare_inputs(image, DEFAULT_PROMPT, mode=mode)
    counts = token_counts(mode, grid)
    assert counts.image_slots == p.image_slots
    assert p.image_slots == slots
    crops, glob = p.images[0]
    assert tuple(crops.shape) == crops_shape
    assert tuple(glob.shape) == (1, 3, global_side, global_side)
    assert p.images_spatial_crop.tolist() == [list(grid)]
    assert p.images_spatial_crop.dtype == torch.long
    assert p.image_sizes == [size]
    assert p.counts[0] == counts
    if grid == (1, 1):
        assert torch.count_nonzero(crops) == 0  # the vendor's zero placeholder


def test_vllm_crop_range_changes_grid():
    image = Image.new("RGB", (1920, 1080), "white")
    assert prepare_inputs(image, mode="gundam", max_crops=6).images_spatial_crop.tolist() == [[2, 1]]
    assert prepare_inputs(image, mode="gundam").image_slots == 1093
    assert prepare_inputs(image, mode="gundam", max_crops=6).image_slots == 483


def test_input_ids_layout_and_mask():
    tok = FallbackTokenizer()
    image = Image.new("RGB", (1280, 1280), "white")
    p = prepare_inputs(image, DEFAULT_PROMPT, tok)
    ids = p.input_ids[0].tolist()
    assert p.input_ids.dtype == torch.long and p.images_seq_mask.dtype == torch.bool
    assert ids[0] == 0 and ids[-1] != 1 and 1 not in ids  # BOS, no EOS
    assert ids.count(IMG) == 693
    assert ids[1:694] == [IMG] * 693  # "<image>" opens the prompt
    assert ids[694:] == tok.encode("\n<|grounding|>Convert the document to markdown.")
    assert 128820 in ids  # <|grounding|> as one special token
    assert torch.equal(p.images_seq_mask, p.input_ids == IMG)
    assert p.text_tokens == len(ids) - 693
    # text before the image tag is encoded before the slots
    q = prepare_inputs(image, "Hi <image> there", tok)
    qi = q.input_ids[0].tolist()
    assert qi[:4] == [0, *tok.encode("Hi ")] and qi[4] == IMG and qi[-6:] == tok.encode(" there")
    assert q.images_seq_mask[0, 4:4 + 693].all() and q.images_seq_mask.sum() == 693


def test_pad_colour_normalises_to_minus_0039():
    image = Image.new("RGB", (1024, 512), (255, 255, 255))  # wide: padded above and below
    glob = prepare_inputs(image, mode="base").images[0][1][0]
    assert glob.shape == (3, 1024, 1024)
    assert torch.allclose(glob[:, :200, :], torch.tensor(PAD_VALUE), atol=1e-6)
    assert torch.allclose(glob[:, -200:, :], torch.tensor(PAD_VALUE), atol=1e-6)
    assert torch.allclose(glob[:, 300:700, :], torch.tensor(1.0))  # centred content
    assert abs(PAD_VALUE + 0.0039) < 1e-4


def test_small_modes_resize_without_padding():
    image = Image.new("RGB", (1000, 300), (255, 0, 0))
    glob = prepare_inputs(image, mode="tiny").images[0][1][0]
    assert torch.allclose(glob[0], torch.tensor(1.0)) and torch.allclose(glob[1:], torch.tensor(-1.0))


def test_tiles_are_row_major():
    image = Image.new("RGB", (1280, 1280))
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)]  # TL, TR, BL, BR
    for k, c in enumerate(colours):
        image.paste(c, ((k % 2) * 640, (k // 2) * 640, (k % 2 + 1) * 640, (k // 2 + 1) * 640))
    crops = prepare_inputs(image).images[0][0]
    assert crops.shape == (4, 3, 640, 640)
    for k, c in enumerate(colours):
        centre = crops[k, :, 320, 320]
        expect = torch.tensor([v / 255 * 2 - 1 for v in c])
        assert torch.allclose(centre, expect, atol=1e-6), k


def test_exif_rotated_jpeg_is_transposed():
    stored = Image.new("RGB", (200, 100), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 100, 100))  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # display = stored rotated 90 degrees clockwise
    data = png_bytes(stored, "JPEG", exif=exif.tobytes(), quality=95)
    img = load_image(data)
    assert img.size == (100, 200) and img.mode == "RGB"
    top, bottom = img.getpixel((50, 20)), img.getpixel((50, 180))
    assert top[0] > 200 and top[2] < 60  # the red half is now on top
    assert bottom[2] > 200 and bottom[0] < 60
    p = prepare_inputs(data, mode="small")
    assert p.image_sizes == [(100, 200)]


def test_sources_path_bytes_file_pil(tmp_path):
    image = Image.new("RGBA", (300, 200), (10, 20, 30, 255))
    path = tmp_path / "page.png"
    image.save(path)
    data = path.read_bytes()
    outs = [prepare_inputs(src, mode="small") for src in (path, str(path), data, io.BytesIO(data), image)]
    for o in outs[1:]:
        assert torch.equal(o.images[0][1], outs[0].images[0][1])
        assert torch.equal(o.input_ids, outs[0].input_ids)


def test_pixel_dtype():
    p = prepare_inputs(Image.new("RGB", (700, 700), "white"), dtype=torch.bfloat16)
    assert p.images[0][0].dtype == torch.bfloat16 and p.images[0][1].dtype == torch.bfloat16
    assert p.input_ids.dtype == torch.long


# ------------------------------------------------------------------------------------------ high bit depth
def _gradient16() -> np.ndarray:
    """A 16-bit gray gradient over the full range, with a dark band: a scanned page at 16 bits."""
    values = np.linspace(0, 65535, 256 * 256).reshape(256, 256).astype(np.uint16)
    values[100:120] = 3000  # text-dark: 11 in 8 bits
    return values


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_16_bit_grayscale_keeps_its_tones(fmt):
    """Before: Pillow's convert("RGB") clipped I;16 to 255, so 99.6% of this page turned white."""
    values = _gradient16()
    data = png_bytes(Image.fromarray(values), fmt)
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    rgb = np.asarray(load_image(data))
    assert rgb.shape == (256, 256, 3) and rgb.dtype == np.uint8
    expected = (values >> 8).astype(np.uint8)  # the top 8 bits of each sample
    for channel in range(3):
        assert np.array_equal(rgb[..., channel], expected)
    assert (rgb == 255).mean() < 0.01 and rgb[110, 0, 0] == 11


def test_32_bit_integer_and_float_images_keep_their_tones():
    values = _gradient16()
    as_int = load_image(Image.fromarray(values.astype(np.int32)))  # mode I, in the 16-bit range
    assert np.array_equal(np.asarray(as_int)[..., 0], (values >> 8).astype(np.uint8))
    unit = values.astype(np.float32) / 65535  # mode F in [0, 1]
    as_float = np.asarray(load_image(png_bytes(Image.fromarray(unit), "TIFF")))[..., 0].astype(int)
    assert np.abs(as_float - np.round(unit * 255)).max() <= 1
    wide = Image.fromarray(values.astype(np.int32) * 1000 - 5_000_000)  # outside 0..65535: its own range
    out = np.asarray(load_image(wide))[..., 0]
    assert out.min() == 0 and out.max() == 255 and out[110, 0] < out[255, 255]


def test_eight_bit_images_are_converted_as_the_vendor_does():
    for image in (Image.new("L", (50, 40), 200), Image.new("P", (50, 40), 3), Image.new("1", (50, 40), 1)):
        assert np.array_equal(np.asarray(load_image(image)), np.asarray(image.convert("RGB")))


# ------------------------------------------------------------------------------------------ bad images
def _truncated_png() -> bytes:
    rng = np.random.default_rng(0)
    data = png_bytes(Image.fromarray(rng.integers(0, 255, (300, 300, 3), dtype=np.uint8)))
    return data[: len(data) // 2]


def _truncated_jpeg() -> bytes:
    rng = np.random.default_rng(1)
    data = png_bytes(Image.fromarray(rng.integers(0, 255, (300, 300, 3), dtype=np.uint8)), "JPEG")
    return data[: len(data) // 3]


@pytest.mark.parametrize("make,needle", [
    (lambda: b"", "empty"),
    (lambda: b"this is not an image at all" * 10, "not a readable image"),
    (lambda: b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "not a readable image"),
    (_truncated_png, "truncated or corrupt"),
    (_truncated_jpeg, "truncated or corrupt"),
    (lambda: png_bytes(Image.new("1", (9000, 8000))), "limit"),  # 72 MP > 64 MP cap
    (lambda: Image.new("RGB", (0, 10)), "zero size"),
    (lambda: 12345, "cannot read an image"),
])
def test_bad_images_raise_one_line(make, needle):
    with pytest.raises(ImageError) as info:
        prepare_inputs(make(), DEFAULT_PROMPT)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg
    assert isinstance(info.value, ValueError)


def test_pil_decompression_bomb_becomes_image_error():
    huge = png_bytes(Image.new("1", (10000, 10000)))  # 100 MP: PIL warns (its limit is ~89 MP)
    with pytest.raises(ImageError, match="decompression bomb"):
        load_image(huge, max_pixels=10**12)
    bigger = png_bytes(Image.new("1", (14000, 14000)))  # 196 MP: PIL raises DecompressionBombError
    with pytest.raises(ImageError, match="decompression bomb"):
        load_image(bigger, max_pixels=10**12)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ImageError, match="not found"):
        load_image(tmp_path / "nope.png")
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match="empty"):
        load_image(empty)


# ------------------------------------------------------------------------------------------ bad prompts
def test_prompt_errors():
    image = Image.new("RGB", (100, 100), "white")
    with pytest.raises(PromptError, match="no <image> tag"):
        prepare_inputs(image, "Free OCR.")
    with pytest.raises(PromptError, match="2 <image> tags"):
        prepare_inputs(image, "<image><image>Free OCR.")
    with pytest.raises(PromptError, match="no image was given"):
        prepare_inputs(None, "<image>\nFree OCR.")
    with pytest.raises(SpecError):
        prepare_inputs(image, DEFAULT_PROMPT, mode="huge")
    with pytest.raises(PromptError):
        prepare_inputs(image, 42)


def test_prompt_checked_before_image_is_decoded():
    with pytest.raises(PromptError):
        prepare_inputs(b"garbage", "no tag here")


def test_text_only_rows():
    p = prepare_inputs(None, "Hello <|grounding|>")
    assert p.images == [] and not p.images_seq_mask.any()
    assert p.input_ids[0, 0] == 0 and p.images_spatial_crop.tolist() == [[0, 0]]


# ------------------------------------------------------------------------------------------ batches
def test_batch_rows():
    a = Image.new("RGB", (1280, 1280), "white")
    b = Image.new("RGB", (1300, 1250), "black")  # same grid (2, 2)
    p = prepare_inputs([a, b], DEFAULT_PROMPT)
    assert p.batch == 2 and p.input_ids.shape == (2, p.seq_len)
    assert p.images_spatial_crop.tolist() == [[2, 2], [2, 2]]
    assert not torch.equal(p.images[0][1], p.images[1][1])
    r = prepare_inputs(a, DEFAULT_PROMPT, batch=3)
    assert r.batch == 3 and torch.equal(r.input_ids[0], r.input_ids[2])
    two_prompts = prepare_inputs(a, ["<image>\nFree OCR.", "<image>\nFree OCR!"])
    assert two_prompts.batch == 2


def test_batch_length_mismatch_is_clear():
    a = Image.new("RGB", (1280, 1280), "white")
    c = Image.new("RGB", (1920, 1080), "white")  # grid (4, 2): more slots
    with pytest.raises(PromptError, match="different lengths"):
        prepare_inputs([a, c], DEFAULT_PROMPT)
    with pytest.raises(PromptError, match="different lengths"):
        prepare_inputs(a, ["<image>\nFree OCR.", "<image>\nParse the figure."])
    with pytest.raises(PromptError, match="2 images but 3 prompts"):
        prepare_inputs([a, a], ["<image>"] * 3)
    with pytest.raises(PromptError, match="no image"):
        prepare_inputs([], DEFAULT_PROMPT)


# ------------------------------------------------------------------------------------------ synthetic
def test_synthetic_inputs_shapes_and_determinism():
    s = synthetic_inputs("gundam", (3, 2), text_tokens=10, batch=2, seed=7, dtype=torch.bfloat16)
    counts = token_counts("gundam", (3, 2))
    assert s.input_ids.shape == (2, counts.image_slots + 10)
    assert s.image_slots == counts.image_slots and s.text_tokens == 10
    assert (s.input_ids[:, 0] == 0).all()
    text = s.input_ids[~s.images_seq_mask]
    text = text[text != 0]
    assert ((text >= 3) & (text < 128815)).all()
    assert torch.equal(s.images_seq_mask, s.input_ids == IMG)
    crops, glob = s.images[0]
    assert crops.shape == (6, 3, 640, 640) and glob.shape == (1, 3, 1024, 1024)
    assert crops.dtype == torch.bfloat16 and -1 <= crops.min() and crops.max() <= 1
    assert s.images_spatial_crop.tolist() == [[3, 2], [3, 2]]
    again = synthetic_inputs("gundam", (3, 2), text_tokens=10, batch=2, seed=7, dtype=torch.bfloat16)
    assert torch.equal(again.input_ids, s.input_ids) and torch.equal(again.images[1][0], s.images[1][0])
    other = synthetic_inputs("gundam", (3, 2), text_tokens=10, batch=2, seed=8, dtype=torch.bfloat16)
    assert not torch.equal(other.images[0][1], s.images[0][1])
    assert not torch.equal(s.input_ids[0], s.input_ids[1])  # rows differ


def test_synthetic_untiled_and_workload():
    s = synthetic_inputs("small", text_tokens=1)
    assert s.seq_len == 1 + 111 and s.images[0][0].shape == (1, 3, 640, 640)
    assert torch.count_nonzero(s.images[0][0]) == 0
    w = Workload(mode="gundam", image_size=(1920, 1080), text_tokens=10, batch=1, dtype="float32")
    s = synthetic_for_workload(w)
    assert s.image_slots == 1093 and s.seq_len == 1103
    w = Workload(mode="gundam", crops=(2, 2), text_tokens=10, batch=3, dtype="bfloat16")
    s = synthetic_for_workload(w)
    assert s.seq_len == 703 and s.batch == 3 and s.images[0][1].dtype == torch.bfloat16
    with pytest.raises(SpecError):
        synthetic_inputs("small", (2, 2))
    with pytest.raises(PromptError):
        synthetic_inputs("gundam", text_tokens=0)


def test_every_pixel_limit_refusal_is_worded_the_same():
    """Our header check and Pillow's own bomb check (which fires first above ~89 MP) give the one message."""
    pattern = (r"image data \(\d+ bytes\): ([\d,]+ x [\d,]+ = )?[\d,]+ megapixels is over the [\d,]+-megapixel limit "
               r"for a page image \(refused before decoding, as a possible decompression bomb\); downscale the page")
    ours = pytest.raises(ImageError)
    with ours:
        load_image(png_bytes(Image.new("1", (3000, 3000))), max_pixels=1_000_000)
    with pytest.raises(ImageError) as pillow:
        load_image(png_bytes(Image.new("1", (10000, 10000))), max_pixels=10**12)
    import re

    assert re.fullmatch(pattern, str(ours.excinfo.value)), str(ours.excinfo.value)
    assert "9 megapixels is over the 1-megapixel limit" in str(ours.excinfo.value)
    assert re.fullmatch(pattern, str(pillow.value)), str(pillow.value)
    assert "100 megapixels is over the 89-megapixel limit" in str(pillow.value)


def test_rows_of_a_batch_keep_every_field_of_those_rows():
    # a counting pass that does not fit runs over parts of the batch (measure/stage_stats.counted_flops)
    from dsocr_core.runtime.inputs import prepare_inputs

    pages = [Image.new("RGB", (1024, 768), c) for c in ("white", "gray", "black")]
    full = prepare_inputs(pages, "<image>\nFree OCR.", mode="gundam")
    part = full.rows(1, 3)
    assert part.batch == 2 and part.seq_len == full.seq_len and part.mode == full.mode
    assert torch.equal(part.input_ids, full.input_ids[1:3])
    assert torch.equal(part.images_seq_mask, full.images_seq_mask[1:3])
    assert torch.equal(part.images_spatial_crop, full.images_spatial_crop[1:3])
    assert all(torch.equal(a, b) and torch.equal(c, d)
               for (a, c), (b, d) in zip(part.images, full.images[1:3]))
    assert part.counts == full.counts[1:3] and part.image_sizes == full.image_sizes[1:3]
    assert part.prompts == full.prompts[1:3] and part.synthetic == full.synthetic
    with pytest.raises(ValueError, match="not within the batch"):
        full.rows(2, 2)
