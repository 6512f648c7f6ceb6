"""Uploaded page files (issue 18): kept under generated names, listed and removable; bad files (empty, not an
image, corrupt, over the pixel limit, password-protected PDFs, zip bombs, zips in zips) refused with the reason;
a choice of uploads becomes a data set whose PDF pages render as the vendor's do."""
from __future__ import annotations

import io
import json
import re

import pytest
from PIL import Image

from dsocr_core.measure import datasets
from dsocr_core.measure.uploads import Limits, UploadStore, page_problem, pixel_limit_message
from page_files import bomb_png, locked_pdf, page_jpeg, page_pdf, page_png, zip_of


@pytest.fixture
def ups(tmp_path):
    return UploadStore(tmp_path / "uploads")


def test_pages_are_kept_under_content_hashes_never_the_users_name(ups):
    png, pdf = page_png(), page_pdf(2)
    res = ups.add("../../etc/passwd.png", png)
    res.extend(ups.add("scan\x00 2024.pdf", pdf))
    res.extend(ups.add("photo.jpeg", page_jpeg()))
    assert not res.rejected and len(res.added) == 3
    files = sorted(p.name for p in ups.root.iterdir())
    assert all(re.fullmatch(r"[0-9a-f]{32}\.(png|pdf|jpg|json)", f) for f in files), files
    assert not (ups.root.parent / "etc").exists()
    by_name = {u.name: u for u in ups.list()}
    assert set(by_name) == {"../../etc/passwd.png", "scan 2024.pdf", "photo.jpeg"}  # shown, never used as a path
    img, doc = by_name["../../etc/passwd.png"], by_name["scan 2024.pdf"]
    assert (img.kind, img.width, img.height, img.pages, img.bytes) == ("image", 420, 560, 1, len(png))
    assert doc.kind == "pdf" and doc.pages == 2 and (doc.width, doc.height) == (300, 400)  # 144 dpi, as saved
    assert ups.add("again.png", png).existing == [img]  # the same content is kept once
    assert ups.remove(img.id) and not ups.remove(img.id) and not ups.path(img).exists()
    assert not ups.remove("../uploads") and ups.get("../x") is None
    assert {u.name for u in ups.list()} == {"scan 2024.pdf", "photo.jpeg"}


def test_bad_files_are_refused_with_the_reason(ups):
    cases = {
        "empty.png": b"",
        "notes.png": b"hello, I am not an image",
        "corrupt.png": page_png()[:80],
        "bomb.png": bomb_png(),
        "locked.pdf": locked_pdf(),
        "broken.pdf": b"%PDF-1.4\n garbage",
        # opens, but its second page points at an object that does not exist (pdfium: "Failed to load page.")
        "damaged.pdf": page_pdf(2).replace(b"/Kids [ 1 0 R 3 0 R ]", b"/Kids [ 1 0 R 99 0 R ]"),
    }
    reasons = {}
    for name, data in cases.items():
        res = ups.add(name, data)
        assert not res.added and len(res.rejected) == 1
        reasons[name] = res.rejected[0].reason
    assert reasons["empty.png"] == "the file is empty"
    assert "not a page image or a PDF" in reasons["notes.png"]
    assert "truncated or corrupt" in reasons["corrupt.png"] or "not a page image" in reasons["corrupt.png"]
    assert reasons["bomb.png"] == pixel_limit_message(40_000 * 40_000)  # the one wording
    assert reasons["damaged.pdf"].startswith("the PDF is damaged: page 2 cannot be read")
    assert "password-protected" in reasons["locked.pdf"]
    assert "cannot open the PDF" in reasons["broken.pdf"]
    assert ups.list() == []
    big = UploadStore(ups.root, Limits(max_file_bytes=1000)).add("big.png", page_png())
    assert "over the" in big.rejected[0].reason and "limit per file" in big.rejected[0].reason


def test_one_pixel_limit_message_for_every_refusal():
    """load_image words every pixel-limit refusal one way; page_problem only drops the byte-source prefix."""
    from dsocr_core.runtime.inputs import ImageError, load_image

    big = io.BytesIO()
    Image.new("1", (9000, 9000)).save(big, format="PNG")
    with pytest.raises(ImageError) as info:
        load_image(big.getvalue())
    assert page_problem(str(info.value)) == pixel_limit_message(81_000_000, (9000, 9000))


def test_a_zip_is_opened_member_by_member_with_limits(ups):
    data = zip_of({"pages/a.png": page_png(seed=1), "pages/b.pdf": page_pdf(1), "../../evil.png": page_png(seed=2),
                   "readme.txt": b"not a page", "inner.zip": zip_of({"c.png": page_png(seed=3)}),
                   "__MACOSX/._a.png": b"junk", ".hidden.png": page_png(seed=4), "empty.png": b"", "dir/": b""})
    res = ups.add("set.zip", data)
    assert sorted(u.name for u in res.added) == ["set.zip/../../evil.png", "set.zip/pages/a.png",
                                                  "set.zip/pages/b.pdf"]
    rejected = {r.name: r.reason for r in res.rejected}
    assert set(rejected) == {"set.zip/readme.txt", "set.zip/inner.zip", "set.zip/empty.png"}
    assert "zip inside a zip" in rejected["set.zip/inner.zip"]
    assert all(p.parent == ups.root for p in ups.root.iterdir())  # nothing written by a member's name
    assert not (ups.root.parent.parent / "evil.png").exists()


def test_zip_bombs_and_huge_zips_are_refused(ups):
    bomb = zip_of({"zeros.png": b"\x00" * 5_000_000})  # 5 MB of zeros packs into a few KB
    small = Limits(max_zip_bytes=1_000_000)
    res = UploadStore(ups.root, small).add("bomb.zip", bomb)
    assert not res.added and "would unpack to" in res.rejected[0].reason
    many = zip_of({f"p{i}.png": b"x" for i in range(6)})
    res = UploadStore(ups.root, Limits(max_zip_members=5)).add("many.zip", many)
    assert "6 entries; at most 5" in res.rejected[0].reason
    # a header that lies about the unpacked size stops at the limit when read
    raw = bytearray(zip_of({"lie.png": b"\x00" * 200_000}))
    for sig in (b"PK\x03\x04", b"PK\x01\x02"):  # patch the declared size in both headers to 10 bytes
        at = raw.index(sig)
        off = at + (22 if sig == b"PK\x03\x04" else 24)
        raw[off:off + 4] = (10).to_bytes(4, "little")
    res = UploadStore(ups.root, Limits(max_zip_bytes=50_000, max_file_bytes=50_000)).add("lie.zip", bytes(raw))
    assert not res.added and ("cannot unpack" in res.rejected[0].reason or "zip bomb" in res.rejected[0].reason)
    assert ups.add("junk.zip", b"PK\x03\x04 not really").rejected[0].reason.startswith("not a readable zip")


def test_encrypted_zip_members_are_refused(ups):
    data = bytearray(zip_of({"a.png": page_png()}))
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # set the 'encrypted' flag bit
        at = data.index(sig)
        data[at + off] |= 0x1
    res = ups.add("locked.zip", bytes(data))
    assert not res.added and "password-protected" in res.rejected[0].reason


def test_uploads_become_a_data_set_pdf_pages_over_the_limit_marked(ups, tmp_path):
    a = ups.add("a.png", page_png(seed=1)).added[0]
    ups.add("doc.pdf", page_pdf(2))
    ups.add("sub/a.png", page_png(seed=2))  # another file with the same display name after the folder
    same = ups.add("a.png", page_png(seed=3)).added[0]  # the same name, other content
    data = ups.dataset()
    names = [p.label for p in data.pages]
    assert names[1:3] == ["doc.pdf p1", "doc.pdf p2"] and "sub/a.png" in names
    assert f"a.png [{a.id[:8]}]" in names and f"a.png [{same.id[:8]}]" in names  # unique names, stable keys
    assert len({p.name for p in data.pages if p.pdf_page is None}) == 3
    img = datasets.load_page(data.pages[1])  # a PDF page rendered at 144 dpi, as the vendor does
    assert img.size == (300, 400)
    only = ups.dataset([a.id])
    assert [p.name for p in only.pages] == ["a.png"] and only.root == ups.root.resolve()
    assert all(p.error is None for p in ups.dataset(dpi=1200).pages)  # 2500 x 3333 px: under the limit
    meta = json.loads((ups.root / f"{ups.list()[1].id}.json").read_text())
    meta["page_sizes_pt"] = [[5000, 5000], [144, 144]]
    (ups.root / f"{meta['id']}.json").write_text(json.dumps(meta))
    marked = [p for p in ups.dataset().pages if p.error]
    assert len(marked) == 1 and "doc.pdf p1: at 144 dpi" in marked[0].error and "megapixels" in marked[0].error
    with pytest.raises(datasets.DatasetError, match="no uploaded pages"):
        ups.dataset(["0" * 32])


def test_damaged_or_foreign_sidecars_are_ignored(ups):
    up = ups.add("a.png", page_png()).added[0]
    (ups.root / ("f" * 32 + ".json")).write_text("{not json")
    (ups.root / ("e" * 32 + ".json")).write_text(json.dumps({**json.loads((ups.root / f"{up.id}.json").read_text()),
                                                             "id": "e" * 32, "file": "../runs.sqlite"}))
    assert [u.id for u in ups.list()] == [up.id]
