import random

import pytest

from dsocr_core.grounding import (
    PAGE_SPLIT,
    normalize_box,
    parse,
    to_markdown,
    to_pixels,
)

GOOD = (
    "<|ref|>title<|/ref|><|det|>[[120, 40, 880, 95]]<|/det|>\n# Quarterly Report  \n\n"
    "<|ref|>text<|/ref|><|det|>[[100, 120, 900, 300]]<|/det|>\nFirst paragraph\nspans two lines.  \n\n"
    "<|ref|>table<|/ref|><|det|>[[100, 320, 900, 600], [100, 610, 900, 700]]<|/det|>\n"
    "<table><tr><td>a</td><td>1</td></tr></table>\n\n"
    "<|ref|>image<|/ref|><|det|>[[100, 720, 500, 950]]<|/det|>\n\n"
    "<|ref|>image_caption<|/ref|><|det|>[[520, 900, 900, 950]]<|/det|>\nFigure 1: bars.\n"
)


def kinds(result):
    return [p.kind for p in result.problems]


def test_well_formed_output():
    r = parse(GOOD)
    assert r.ok and kinds(r) == []
    assert [b.label for b in r.blocks] == ["title", "text", "table", "image", "image_caption"]
    assert [b.index for b in r.blocks] == [0, 1, 2, 3, 4]
    assert r.blocks[0].boxes == [(120, 40, 880, 95)]
    assert r.blocks[0].content == "# Quarterly Report"
    assert r.blocks[1].content == "First paragraph\nspans two lines."
    assert r.blocks[2].boxes == [(100, 320, 900, 600), (100, 610, 900, 700)]
    assert r.blocks[2].bbox == (100, 320, 900, 700)
    assert r.blocks[2].content == "<table><tr><td>a</td><td>1</td></tr></table>"
    assert r.blocks[3].content == ""
    assert r.labels() == {"title": 1, "text": 1, "table": 1, "image": 1, "image_caption": 1}
    assert len(r.pages) == 1 and r.blocks[0].page == 0


@pytest.mark.parametrize("text", ["", None, "   \n\n"])
def test_empty_output(text):
    r = parse(text)
    assert r.blocks == [] and r.problems == [] and len(r.pages) == 1


def test_plain_text_without_tags():
    r = parse("Free OCR output with no grounding at all.\nSecond line.")
    assert r.blocks == [] and r.ok
    assert to_markdown(r) == "Free OCR output with no grounding at all.\nSecond line."


def test_eos_is_removed():
    r = parse(GOOD + "<｜end▁of▁sentence｜>")
    assert r.ok and r.blocks[-1].content == "Figure 1: bars."


def test_unclosed_ref_at_end():
    r = parse(GOOD + "<|ref|>tit")
    assert "unclosed_ref" in kinds(r) and "ref_without_det" in kinds(r)
    assert r.blocks[-1].label == "tit" and r.blocks[-1].boxes == []
    assert len(r.blocks) == 6
    assert all(p.page == 0 for p in r.problems)


def test_unclosed_ref_before_det():
    r = parse("<|ref|>text<|det|>[[1, 2, 3, 4]]<|/det|>\nhello")
    assert kinds(r) == ["unclosed_ref"]
    assert r.blocks[0].label == "text" and r.blocks[0].boxes == [(1, 2, 3, 4)] and r.blocks[0].content == "hello"


def test_truncated_inside_det():
    r = parse(GOOD + "<|ref|>text<|/ref|><|det|>[[10, 20, 3")
    assert "unclosed_det" in kinds(r) and "bad_box" in kinds(r)
    assert r.blocks[-1].label == "text" and r.blocks[-1].boxes == []
    assert len(r.blocks) == 6 and r.blocks[4].content == "Figure 1: bars."


def test_unclosed_det_keeps_readable_boxes_and_content():
    r = parse("<|ref|>text<|/ref|><|det|>[[10, 20, 30, 40]]\nthe content\n")
    assert kinds(r) == ["unclosed_det"]
    assert r.blocks[0].boxes == [(10, 20, 30, 40)] and r.blocks[0].content == "the content"


@pytest.mark.parametrize("tail", ["<", "<|", "<|r", "<|re", "<|ref", "<|ref|", "<|/", "<|/d", "<|/det|", "<|de"])
def test_cut_mid_tag(tail):
    r = parse(GOOD + tail)
    assert len(r.blocks) == 5
    assert r.blocks[-1].content.startswith("Figure 1: bars.")
    if tail != "<":
        assert kinds(r) == ["truncated_tag"]
        assert r.blocks[-1].content == "Figure 1: bars."
        assert tail not in to_markdown(r)


def test_cut_in_closing_det_tag_keeps_box():
    r = parse("<|ref|>text<|/ref|><|det|>[[10, 20, 30, 40]]<|/det|")
    assert set(kinds(r)) == {"truncated_tag", "unclosed_det"}
    assert r.blocks[0].boxes == [(10, 20, 30, 40)]


def test_bad_coordinates():
    text = ("<|ref|>text<|/ref|><|det|>[[10, abc, 30, 40], [5, 6, 1200, 8], [-3, 1, 2, 3], [1.5, 2, 3, 4], "
            "[9, 9, 1, 1], [1, 2, 3]]<|/det|>\nbody")
    r = parse(text)
    b = r.blocks[0]
    assert b.boxes == [(5, 6, 999, 8), (0, 1, 2, 3), (2, 2, 3, 4), (1, 1, 9, 9)]
    k = kinds(r)
    assert k.count("bad_box") == 2  # non-numeric, three values
    assert k.count("coordinate_range") == 2 and "non_integer" in k and "inverted_box" in k
    assert b.content == "body"
    assert all(p.block == 0 for p in r.problems)


def test_absurd_numbers_do_not_raise():
    r = parse("<|ref|>a<|/ref|><|det|>[[" + "9" * 400 + ", 1, 2, 3]]<|/det|>")
    assert r.blocks[0].boxes == [(2, 1, 999, 3)]
    assert all(len(p.message) < 300 for p in r.problems)


def test_det_without_numbers_and_empty_det():
    r = parse("<|ref|>a<|/ref|><|det|>nothing here<|/det|>\nx\n<|ref|>b<|/ref|><|det|><|/det|>\ny")
    assert [b.boxes for b in r.blocks] == [[], []]
    assert "bad_box" in kinds(r) and kinds(r).count("no_boxes") == 2
    assert [b.content for b in r.blocks] == ["x", "y"]


def test_stray_tags_and_det_without_ref():
    r = parse("intro <|/ref|> text\n<|det|>[[1, 2, 3, 4]]<|/det|>\nbody <|/det|> more")
    assert "stray_tag" in kinds(r) and "det_without_ref" in kinds(r)
    assert len(r.blocks) == 1 and r.blocks[0].label == "" and r.blocks[0].boxes == [(1, 2, 3, 4)]
    assert r.blocks[0].content == "body  more"
    md = to_markdown(r)
    assert "<|" not in md and md.startswith("intro  text\n")


def test_empty_label_and_long_label():
    r = parse("<|ref|><|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>\na\n<|ref|>" + "x" * 100 + "<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>")
    assert "empty_label" in kinds(r) and "long_label" in kinds(r)
    assert r.blocks[1].label == "x" * 64


def test_repetition_loop_cut_mid_tag():
    unit = "<|ref|>text<|/ref|><|det|>[[100, 200, 300, 400]]<|/det|>\nsame line again\n\n"
    r = parse(GOOD + unit * 6 + "<|ref|>text<|/ref|><|det|>[[100, 2")
    assert "repetition" in kinds(r) and "unclosed_det" in kinds(r)
    assert len(r.blocks) == 5 + 6 + 1
    rep = [p for p in r.problems if p.kind == "repetition"][0]
    assert "6 times" in rep.message and rep.block == 5


def test_text_loop_detected():
    r = parse("Intro.\n" + "the same words " * 40)
    assert kinds(r) == ["repetition"]
    assert not parse("Intro.\n" + "the same words " * 2).problems


def test_page_splits():
    text = GOOD + "\n" + PAGE_SPLIT + "\n" + GOOD + PAGE_SPLIT + "\nplain third page\n"
    r = parse(text)
    assert len(r.pages) == 3
    assert [b.page for b in r.blocks] == [0] * 5 + [1] * 5
    assert [b.index for b in r.blocks] == list(range(10))
    assert r.blocks[4].content == "Figure 1: bars."  # the split line is not content
    assert len(r.page_blocks(1)) == 5 and r.page_blocks(2) == []
    md = to_markdown(r)
    assert md.count(PAGE_SPLIT) == 2
    assert "![](images/0.jpg)" in md and "![](images/1.jpg)" in md  # numbered across pages


def test_markdown_like_vendor():
    md = to_markdown(GOOD)
    assert md == ("\n# Quarterly Report  \n\n\nFirst paragraph\nspans two lines.  \n\n\n"
                  "<table><tr><td>a</td><td>1</td></tr></table>\n\n![](images/0.jpg)\n\n\n\nFigure 1: bars.\n")


def test_problems_have_positions():
    text = "abc\n<|ref|>text<|/ref|><|det|>[[1, 2, x, 4]]<|/det|>\n"
    r = parse(text)
    assert r.problems[0].position == text.index("<|det|>") and "page 0 char 23" in str(r.problems[0])
    assert r.to_dict()["problems"][0]["kind"] == "bad_box"


def test_never_raises_on_truncations_and_noise():
    rng = random.Random(0)
    text = GOOD + PAGE_SPLIT + GOOD
    full = len(parse(text).blocks)
    for cut in range(len(text) + 1):
        r = parse(text[:cut])
        assert len(r.blocks) <= full
        to_markdown(r)
    pieces = ["<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "[[", "]]", "[", "]", ",", " 12", "999", "-5", "x",
              "\n", PAGE_SPLIT, "<|", "|>", "title", "<td>", "1.5", "9" * 30]
    for _ in range(500):
        noise = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        r = parse(noise)
        assert all(p.kind != "parser_error" for p in r.problems), noise
        for b in r.blocks:
            assert all(0 <= v <= 999 for box in b.boxes for v in box)
            assert all(box[0] <= box[2] and box[1] <= box[3] for box in b.boxes)
        to_markdown(r)


def test_pixel_conversion_round_trip():
    size = (1240, 1754)
    box = (100.0, 200.0, 1100.0, 1500.0)
    norm = normalize_box(box, size)
    back = to_pixels(norm, size)
    assert all(abs(a - b) <= size[i % 2] / 999 for i, (a, b) in enumerate(zip(box, back)))
    assert to_pixels((0, 0, 999, 999), size) == (0, 0, 1240, 1754)
    assert normalize_box((-5, 0, 5000, 10), size)[0] == 0 and normalize_box((-5, 0, 5000, 10), size)[2] == 999
