import json

import PIL
import pytest
from PIL import Image

from dsocr_core.cli import main
from dsocr_core.grounding import parse, to_pixels
from dsocr_core.runtime.inputs import prepare_inputs
from dsocr_core.grounding.samples import DEFAULT_DIR, PAGES, draw_page, load_index, sample_grounding, sample_pages
from dsocr_core.tiling import crop_grid, token_counts

INDEX = load_index(DEFAULT_DIR)
RECORDS = INDEX["pages"] if INDEX else []


def test_bundled_samples_present_and_small():
    assert INDEX is not None, "data/samples/index.json missing: run `python -m dsocr_core samples`"
    assert [r["name"] for r in RECORDS] == [s.name for s in PAGES]
    total = 0
    for r in RECORDS:
        for key in ("file", "grounding"):
            path = DEFAULT_DIR / r[key]
            assert path.is_file(), path
            total += path.stat().st_size
    assert total < 600_000
    assert sample_pages() == [DEFAULT_DIR / r["file"] for r in RECORDS]
    sizes = {(r["width"], r["height"]) for r in RECORDS}
    assert {(1240, 1754), (1275, 1650), (1920, 1080), (640, 832), (1024, 1024)} <= sizes


@pytest.mark.parametrize("record", RECORDS, ids=[r["name"] for r in RECORDS])
def test_grounding_round_trip(record):
    size = (record["width"], record["height"])
    with Image.open(DEFAULT_DIR / record["file"]) as img:
        assert img.size == size
    result = parse(sample_grounding(record["name"]))
    assert result.ok, [str(p) for p in result.problems]
    drawn = record["blocks"]
    assert [b.label for b in result.blocks] == [d["label"] for d in drawn]
    assert {"title", "text", "table", "image", "image_caption"} <= {b.label for b in result.blocks}
    for block, d in zip(result.blocks, drawn):
        assert len(block.boxes) == 1
        back = to_pixels(block.boxes[0], size)
        for k, (got, want) in enumerate(zip(back, d["box"])):
            assert abs(got - want) <= 0.01 * size[k % 2], (record["name"], block.label, back, d["box"])
        assert block.content == d["content"].strip()


@pytest.mark.parametrize("record", RECORDS, ids=[r["name"] for r in RECORDS])
def test_index_grids_and_slots(record):
    w, h = record["width"], record["height"]
    for key, rng in (("gundam_hf", (2, 9)), ("gundam_vllm", (2, 6))):
        grid = crop_grid(w, h, "gundam", *rng)
        assert record[key]["grid"] == list(grid) and record[key]["crop_range"] == list(rng)
        assert record[key]["image_slots"] == token_counts("gundam", grid).image_slots
    p = prepare_inputs(DEFAULT_DIR / record["file"], mode="gundam")
    assert p.image_slots == record["gundam_hf"]["image_slots"]
    assert p.images_spatial_crop.tolist() == [record["gundam_hf"]["grid"]]


def test_grids_cover_several_shapes():
    grids = {tuple(r["gundam_hf"]["grid"]) for r in RECORDS}
    assert len(grids) >= 4 and (1, 1) in grids
    assert any(r["gundam_hf"]["grid"] != r["gundam_vllm"]["grid"] for r in RECORDS)


def test_drawing_is_deterministic():
    spec = PAGES[3]
    a, b = draw_page(spec), draw_page(spec)
    assert a.image.tobytes() == b.image.tobytes()
    assert a.grounding_text() == b.grounding_text()


def test_cli_regenerates_same_pages(tmp_path, capsys):
    assert main(["samples", "--out", str(tmp_path)]) == 0
    assert "wrote 7 pages" in capsys.readouterr().out
    fresh = json.loads((tmp_path / "index.json").read_text())
    assert [r["name"] for r in fresh["pages"]] == [s.name for s in PAGES]
    if fresh["pillow"] != INDEX["pillow"]:
        pytest.skip(f"stored pages drawn with Pillow {INDEX['pillow']}, this is {PIL.__version__}")
    assert fresh == INDEX
    for r in RECORDS:
        assert (tmp_path / r["grounding"]).read_text() == sample_grounding(r["name"])
        with Image.open(tmp_path / r["file"]) as new, Image.open(DEFAULT_DIR / r["file"]) as old:
            assert new.convert("RGB").tobytes() == old.convert("RGB").tobytes()
