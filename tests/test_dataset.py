"""Page discovery (folders, list files, PDFs), sampling and page loading, on the project's own sample pages."""
import shutil

import pytest
from PIL import Image

from dsocr_core.measure.datasets import (DatasetError, Page, discover, load_page, render_pdf_page, sample)
from dsocr_core.runtime.inputs import ImageError
from dsocr_core.grounding.samples import sample_pages

SAMPLES = {p.stem: p for p in sample_pages()}


def make_pdf(path, names=("receipt", "card"), resolution=150.0):
    images = [Image.open(SAMPLES[n]).convert("RGB") for n in names]
    images[0].save(path, save_all=True, append_images=images[1:], resolution=resolution)
    return images


def test_folder_lists_images_sorted_and_ignores_other_files():
    ds = discover(SAMPLES["card"].parent)
    assert [p.name for p in ds.pages] == sorted(f"{n}.png" for n in SAMPLES)  # the .txt/.json files are skipped
    assert all(p.pdf_page is None and p.error is None and p.path.is_absolute() for p in ds.pages)
    assert ds.root == SAMPLES["card"].parent.resolve()


def test_folder_is_recursive_skips_hidden_and_splits_pdfs(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".cache").mkdir()
    shutil.copy(SAMPLES["card"], tmp_path / "sub" / "card.png")
    shutil.copy(SAMPLES["small"], tmp_path / ".cache" / "small.png")
    shutil.copy(SAMPLES["small"], tmp_path / ".hidden.png")
    make_pdf(tmp_path / "doc.PDF")
    ds = discover(tmp_path)
    assert [(p.name, p.pdf_page) for p in ds.pages] == [("doc.PDF", 0), ("doc.PDF", 1), ("sub/card.png", None)]
    assert ds.pages[0].pdf_pages == 2 and ds.pages[1].label == "doc.PDF p2"
    assert [p.name for p in discover(tmp_path, recursive=False).pages] == ["doc.PDF", "doc.PDF"]


def test_list_file_relative_absolute_comments_duplicates_and_missing(tmp_path):
    (tmp_path / "pages").mkdir()
    shutil.copy(SAMPLES["card"], tmp_path / "pages" / "card.png")
    listing = tmp_path / "list.txt"
    listing.write_text(f"# my pages\n\npages/card.png\n  pages/card.png  \n{SAMPLES['small']}\npages/gone.png\n",
                       encoding="utf-8")
    ds = discover(listing)
    assert ds.root == tmp_path.resolve()
    names = [p.name for p in ds.pages]
    assert names == ["pages/card.png", SAMPLES["small"].resolve().as_posix(), "pages/gone.png"]
    assert ds.pages[2].error and "not found" in ds.pages[2].error
    with pytest.raises(ImageError, match="not found"):
        load_page(ds.pages[2])


def test_empty_or_missing_sources_are_refused(tmp_path):
    with pytest.raises(DatasetError, match="no such"):
        discover(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.md").write_text("no pages here")
    with pytest.raises(DatasetError, match="no pages"):
        discover(empty)
    (tmp_path / "blank.txt").write_text("# nothing\n\n")
    with pytest.raises(DatasetError, match="no pages"):
        discover(tmp_path / "blank.txt")


def test_pdf_pages_render_at_the_chosen_dpi(tmp_path):
    images = make_pdf(tmp_path / "doc.pdf", resolution=150.0)
    w, h = images[0].size  # 600x1800 pixels at 150 dpi -> 288x864 points
    img = render_pdf_page(tmp_path / "doc.pdf", 0)  # 144 dpi by default, as the vendor
    assert img.mode == "RGB"
    assert abs(img.size[0] - w * 144 / 150) <= 1 and abs(img.size[1] - h * 144 / 150) <= 1
    small = load_page(Page(tmp_path / "doc.pdf", "doc.pdf", 1, 2), dpi=72)
    cw, ch = images[1].size
    assert abs(small.size[0] - cw * 72 / 150) <= 1 and abs(small.size[1] - ch * 72 / 150) <= 1
    with pytest.raises(ImageError, match="no page 3"):
        render_pdf_page(tmp_path / "doc.pdf", 2)
    with pytest.raises(ImageError, match="megapixel limit for a PDF page"):
        render_pdf_page(tmp_path / "doc.pdf", 0, dpi=144, max_pixels=10_000)


def test_corrupt_pdf_is_listed_with_its_error(tmp_path):
    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    shutil.copy(SAMPLES["card"], tmp_path / "card.png")
    ds = discover(tmp_path)
    bad = [p for p in ds.pages if p.name == "bad.pdf"]
    assert len(bad) == 1 and bad[0].error and "cannot open the PDF" in bad[0].error
    with pytest.raises(ImageError, match="cannot open the PDF"):
        load_page(bad[0])


def test_corrupt_image_fails_on_load(tmp_path):
    data = SAMPLES["card"].read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.jpg").write_bytes(b"not an image at all")
    pages = {p.name: p for p in discover(tmp_path).pages}
    for name in ("cut.png", "junk.jpg"):
        assert pages[name].error is None  # only loading can tell
        with pytest.raises(ImageError):
            load_page(pages[name])


# ---------------------------------------------------------------------------------------------- sampling
PAGES = discover(SAMPLES["card"].parent).pages


def keys(samples):
    return [(s.page.name, s.epoch) for s in samples]


def test_sampling_is_reproducible_with_a_seed():
    a = sample(PAGES, n=4, epochs=3, seed=7)
    b = sample(PAGES, n=4, epochs=3, seed=7)
    assert keys(a) == keys(b) and len(a) == 12
    assert keys(sample(PAGES, n=4, epochs=3, seed=8)) != keys(a)
    per_epoch = [[s.page.name for s in a if s.epoch == e] for e in range(3)]
    assert per_epoch[0] != per_epoch[1] or per_epoch[1] != per_epoch[2]  # each epoch its own shuffle
    assert all(len(set(e)) == 4 for e in per_epoch)  # no page twice in an epoch


def test_more_epochs_or_pages_extend_rather_than_reshuffle():
    small = sample(PAGES, n=3, epochs=2, seed=1)
    more_epochs = sample(PAGES, n=3, epochs=4, seed=1)
    assert keys(more_epochs)[:6] == keys(small)
    bigger = sample(PAGES, n=5, epochs=1, seed=1)
    assert keys(bigger)[:3] == keys(small)[:3]


def test_fixed_order_clamping_and_keys():
    fixed = sample(PAGES, n=3, epochs=2, order="fixed")
    assert [s.page.name for s in fixed] == [p.name for p in PAGES[:3]] * 2
    everything = sample(PAGES, n=100, epochs=1, seed=3)
    assert sorted(s.page.name for s in everything) == sorted(p.name for p in PAGES)
    assert everything[0].key == {"page": everything[0].page.name, "pdf_page": None, "epoch": 0}
    assert len({str(s.key) for s in sample(PAGES, epochs=3)}) == 3 * len(PAGES)


@pytest.mark.parametrize("kwargs,match", [({"epochs": 0}, "epochs"), ({"n": 0}, "at least 1"),
                                          ({"order": "shuffled"}, "order")])
def test_bad_sampling_options(kwargs, match):
    with pytest.raises(DatasetError, match=match):
        sample(PAGES, **kwargs)
