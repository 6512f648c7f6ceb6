import json

import pytest

from dsocr_core.grounding import Block, compare_outputs, compare_pair, first_divergence, iou, match_blocks, parse


def block(label, box, content=""):
    return f"<|ref|>{label}<|/ref|><|det|>[[{box[0]}, {box[1]}, {box[2]}, {box[3]}]]<|/det|>\n{content}\n\n"


PAGE = [("title", (100, 30, 900, 80), "# Report"), ("text", (100, 100, 900, 300), "Alpha beta gamma."),
        ("table", (100, 320, 900, 600), "<table><tr><td>1</td></tr></table>"),
        ("image", (100, 620, 600, 900), ""), ("image_caption", (620, 850, 900, 900), "Figure 1.")]


def page(blocks=PAGE):
    return "".join(block(*b) for b in blocks)


def test_identical():
    c = compare_outputs(page(), page())
    p = c.pairs[0]
    assert (p.reference, p.other) == ("one-shot", "separated")
    assert p.precision == p.recall == p.f1 == 1.0 and p.mean_iou == 1.0
    assert p.label_agreement == p.content_exact == p.content_mean_ratio == 1.0
    assert p.identical_text and p.text_divergence is None and c.identical
    assert p.unmatched_reference == p.unmatched_other == []
    assert all(r["same_label"] and r["same_boxes"] and r["same_content"] for r in p.side_by_side)
    assert len(p.side_by_side) == 5
    assert c.outputs[0].labels == {"title": 1, "text": 1, "table": 1, "image": 1, "image_caption": 1}


def test_empty_outputs():
    c = compare_outputs("", "")
    p = c.pairs[0]
    assert p.precision == p.recall == 1.0 and p.mean_iou is None and c.identical
    q = compare_pair(page(), "")
    assert q.recall == 0.0 and q.precision == 0.0 and q.mean_iou is None


def test_shifted_boxes():
    shifted = [(lab, (b[0] + 10, b[1] + 5, b[2] + 10, b[3] + 5), txt) for lab, b, txt in PAGE]
    p = compare_outputs(page(), page(shifted)).pairs[0]
    assert p.precision == p.recall == 1.0
    assert 0.5 < p.mean_iou < 1.0
    assert p.content_exact == 1.0
    assert not p.identical_text
    d = p.text_divergence
    assert (d.index, d.a, d.b) == (page().index("[[100") + 3, "0", "1")
    far = list(PAGE)
    far[1] = ("text", (100, 700, 900, 800), PAGE[1][2])  # moved away from where it was: IoU 0
    q = compare_outputs(page(), page(far)).pairs[0]
    assert q.recall == q.precision == pytest.approx(4 / 5)
    assert q.unmatched_reference == [1] and q.unmatched_other == [1]
    assert all(m.iou >= 0.5 for m in q.matches)


def test_missing_blocks():
    p = compare_outputs(page(), page(PAGE[:3])).pairs[0]
    assert p.recall == pytest.approx(3 / 5) and p.precision == 1.0
    assert p.unmatched_reference == [3, 4] and p.unmatched_other == []
    assert p.labels["image"] == [1, 0]
    assert p.side_by_side[3]["other"] is None
    extra = compare_outputs(page(PAGE[:3]), page()).pairs[0]
    assert extra.precision == pytest.approx(3 / 5) and extra.recall == 1.0


def test_label_and_content_differences():
    changed = list(PAGE)
    changed[1] = ("title", PAGE[1][1], "Alpha beta gamma!")
    p = compare_outputs(page(), page(changed)).pairs[0]
    assert p.precision == p.recall == 1.0  # matching is by geometry
    assert p.label_agreement == pytest.approx(4 / 5)
    m = [m for m in p.matches if m.a == 1][0]
    assert not m.same_label and not m.content_equal and 0.8 < m.content_ratio < 1.0
    assert p.content_exact == pytest.approx(4 / 5)
    row = p.side_by_side[1]
    assert not row["same_label"] and row["same_boxes"] and not row["same_content"]
    assert "gamma!" in row["content_diff"]
    assert p.labels["title"] == [1, 2] and p.labels["text"] == [1, 0]


def test_whitespace_only_content_difference_counts_as_equal():
    changed = list(PAGE)
    changed[1] = ("text", PAGE[1][1], "Alpha  beta\ngamma.")
    p = compare_outputs(page(), page(changed)).pairs[0]
    assert p.content_exact == 1.0 and not p.identical_text


def test_three_way_with_vendor():
    vendor = page(PAGE[:4])
    c = compare_outputs(page(), page(), vendor)
    assert [o.name for o in c.outputs] == ["one-shot", "separated", "vendor"]
    assert [(p.reference, p.other) for p in c.pairs] == [("one-shot", "separated"), ("vendor", "one-shot"),
                                                         ("vendor", "separated")]
    v = c.pair("vendor", "one-shot")
    assert v.recall == 1.0 and v.precision == pytest.approx(4 / 5)
    assert not c.identical
    with pytest.raises(KeyError):
        c.pair("vendor", "nobody")
    c2 = compare_outputs(page(), page(), vendor, names=("a", "b", "ref"))
    assert c2.pair("ref", "b").n_reference == 4


def test_token_divergence_and_json():
    c = compare_outputs(page(), page(), ids_a=[5, 6, 7, 8], ids_b=[5, 6, 9])
    assert (c.token_divergence.index, c.token_divergence.a, c.token_divergence.b) == (2, 7, 9)
    d = json.loads(json.dumps(c.to_dict()))
    assert d["token_divergence"]["index"] == 2 and d["identical"] is True
    assert d["pairs"][0]["matches"][0]["iou"] == 1.0
    assert json.loads(c.to_json())["iou_threshold"] == 0.5
    broken = compare_outputs("<|ref|>text<|/ref|><|det|>[[1, 2", page())
    assert broken.outputs[0].problems > 0 and broken.pairs[0].recall == 0.0


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence("abc", "abc") is None
    d = first_divergence([1, 2, 3], [1, 2, 3, 4])
    assert (d.index, d.a, d.b) == (3, None, 4)
    d = first_divergence("line one\nline two", "line one\nline TWO", context=3)
    assert (d.index, d.a, d.b, d.line, d.column) == (14, "t", "T", 2, 6)
    assert d.context_a == "ne two" and d.context_b == "ne TWO"
    d = first_divergence("", "x")
    assert (d.index, d.a, d.b, d.line, d.column) == (0, None, "x", 1, 1)
    with pytest.raises(TypeError):
        first_divergence("abc", [1, 2])


def test_optimal_assignment_beats_greedy():
    def b(x1, x2, i):
        return Block("text", [(x1, 0, x2, 100)], "", 0, i)

    ref = [b(0, 100, 0), b(20, 120, 1)]
    other = [b(10, 110, 0), b(0, 70, 1)]
    # greedy would pair ref0 with other0 (IoU 0.82) and leave ref1 with other1 (IoU 0.42 < 0.5)
    assert iou(ref[0].bbox, other[0].bbox) > iou(ref[0].bbox, other[1].bbox) >= 0.5
    assert iou(ref[1].bbox, other[1].bbox) < 0.5
    pairs = match_blocks(ref, other, 0.5)
    assert sorted((i, j) for i, j, _ in pairs) == [(0, 1), (1, 0)]


def test_blocks_on_different_pages_never_match():
    a = parse(page(PAGE[:1]))
    b = parse("<--- Page Split --->" + page(PAGE[:1]))
    assert match_blocks(a.blocks, b.blocks) == []


def test_iou_basics():
    assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou((0, 0, 10, 10), (10, 10, 20, 20)) == 0.0
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(1 / 3)
    assert iou(None, (0, 0, 1, 1)) == 0.0
    assert iou((5, 5, 5, 5), (5, 5, 5, 5)) == 1.0
