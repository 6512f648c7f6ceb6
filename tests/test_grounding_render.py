from PIL import Image

from dsocr_core.grounding import (
    Block,
    block_colour,
    build_result,
    crop_images,
    parse,
    render,
    save_result,
    to_markdown,
)

W, H = 999, 999  # pixels == normalised coordinates, so box edges fall on known pixels


def white(size=(W, H)):
    return Image.new("RGB", size, (255, 255, 255))


def test_block_colours_are_deterministic_and_distinct():
    assert block_colour(3) == block_colour(3)
    assert len({block_colour(i) for i in range(20)}) == 20
    assert block_colour(3, seed=1) != block_colour(3)


def test_outline_fill_and_label():
    title = Block("title", [(100, 200, 500, 400)], "# T", 0, 0)
    text = Block("text", [(100, 600, 500, 800)], "body", 0, 1)
    img = white()
    out = render(img, [title, text], fill_alpha=40)
    assert out.size == img.size and out.mode == "RGB"
    assert img.getpixel((300, 300)) == (255, 255, 255)  # input untouched
    for blk, width in ((title, 4), (text, 2)):
        colour = block_colour(blk.index)
        x1, y1, x2, y2 = blk.boxes[0]
        ym = (y1 + y2) // 2
        for k in range(width):  # the outline: exactly the block colour, `width` pixels wide
            assert out.getpixel((x1 + k, ym)) == colour, (blk.label, k)
            assert out.getpixel((x2 - k, ym)) == colour
        inside = out.getpixel((x1 + width + 5, ym))
        expect = tuple(round(255 + (c - 255) * 40 / 255) for c in colour)
        assert all(abs(a - b) <= 2 for a, b in zip(inside, expect)), (inside, expect)  # translucent fill
        assert inside != colour and inside != (255, 255, 255)
        assert out.getpixel(((x1 + x2) // 2, (y1 + y2) // 2)) == inside
        assert out.getpixel((x1 - 3, ym)) == (255, 255, 255)  # nothing outside the box
        above = out.crop((x1, max(0, y1 - 30), x1 + 80, y1 - 1))
        assert above.getextrema() != ((255, 255), (255, 255), (255, 255))  # the label text
    assert render(img, [title, text]).tobytes() == out.tobytes()  # deterministic


def test_render_denormalises_to_original_size():
    img = white((2000, 500))
    blk = Block("text", [(0, 0, 499, 999)], "", 0, 0)
    out = render(img, [blk])
    colour = block_colour(0)
    assert out.getpixel((int(499 / 999 * 2000), 250)) == colour  # right edge at x/999*W
    assert out.getpixel((1500, 250)) == (255, 255, 255)


def test_render_page_filter_and_overlaps():
    a = Block("text", [(100, 100, 600, 600)], "", 0, 0)
    b = Block("text", [(300, 300, 900, 900)], "", 1, 1)
    only0 = render(white(), [a, b], page=0)
    assert only0.getpixel((800, 800)) == (255, 255, 255)
    both = render(white(), [a, b])
    overlap, single = both.getpixel((450, 450)), both.getpixel((200, 200))
    assert sum(overlap) < sum(single)  # fills blend instead of overwriting


def test_render_survives_odd_boxes():
    blocks = [Block("text", [(0, 0, 0, 0), (999, 999, 999, 999), (5, 5, 5, 900)], "", 0, 0),
              Block("", [(10, 10, 20, 20)], "", 0, 1)]
    out = render(white((30, 40)), blocks)
    assert out.size == (30, 40)
    rgba = Image.new("RGBA", (50, 50), (0, 0, 0, 0))
    assert render(rgba, blocks).mode == "RGB"


def test_crops_and_saved_files(tmp_path):
    img = white((800, 600))
    img.paste((255, 0, 0), (80, 60, 400, 300))
    text = ("<|ref|>title<|/ref|><|det|>[[10, 10, 500, 50]]<|/det|>\n# Page\n\n"
            "<|ref|>image<|/ref|><|det|>[[100, 100, 500, 500]]<|/det|>\n\n"
            "<|ref|>image<|/ref|><|det|>[[600, 600, 900, 900], [0, 900, 100, 999]]<|/det|>\n\n")
    r = parse(text)
    crops = crop_images(img, r.blocks)
    assert len(crops) == 3
    assert crops[0].size == (int(500 / 999 * 800) - int(100 / 999 * 800), int(500 / 999 * 600) - int(100 / 999 * 600))
    assert crops[0].getpixel((5, 5)) == (255, 0, 0)
    assets = save_result(tmp_path / "out", img, text)
    names = sorted(p.relative_to(tmp_path / "out").as_posix() for p in assets.files)
    assert names == ["images/0.jpg", "images/1.jpg", "images/2.jpg", "result.mmd", "result_with_boxes.jpg"]
    md = (tmp_path / "out" / "result.mmd").read_text()
    assert md == to_markdown(text)
    assert md.count("![](images/") == 3 and "<|ref|>" not in md and "# Page" in md
    with Image.open(tmp_path / "out" / "result_with_boxes.jpg") as saved:
        assert saved.size == (800, 600)
    assert assets.boxes_image.size == (800, 600)


def test_multi_page_result():
    pages = [white((300, 400)), white((500, 200))]
    text = ("<|ref|>image<|/ref|><|det|>[[0, 0, 500, 500]]<|/det|>\n<--- Page Split --->\n"
            "<|ref|>image<|/ref|><|det|>[[500, 500, 999, 999]]<|/det|>\n")
    assets = build_result(pages, text)
    assert [im.size for im in assets.boxes_images] == [(300, 400), (500, 200)]
    assert [c.size for c in assets.crops] == [(150, 200), (250, 100)]
    one = build_result(pages[0], text)  # one image serves every page
    assert len(one.boxes_images) == 2 and len(one.crops) == 2


def test_a_16_bit_page_is_drawn_and_cropped_in_its_tones():
    import numpy as np

    gray = np.full((H, W), 20_000, dtype=np.uint16)  # mid-dark at 16 bits: 78 in 8 bits, not white
    page = Image.fromarray(gray)
    assert page.mode == "I;16"
    blocks = parse("<|ref|>image<|/ref|><|det|>[[100, 100, 300, 300]]<|/det|>").blocks
    drawn = np.asarray(render(page, blocks))
    assert drawn[900, 900].tolist() == [78, 78, 78]  # outside every box: the page itself
    crop = np.asarray(crop_images(page, blocks)[0])
    assert crop.shape[2] == 3 and (crop == 78).all()
