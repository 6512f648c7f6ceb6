"""Profiling the user's own pages from the measured page's 'Dataset runs' tab (issue 18), through AppTest: upload
generated pages, a PDF and bad files; the bad ones are listed with the reason and skipped; a short dataset run
of the synthetic tiny model on the CPU runs in the background; its per-page charts, distribution, slowest pages,
operator breakdown and a comparison with a second run are drawn."""
from __future__ import annotations

import io

from PIL import Image

from dsocr_core.results.store import RunStore
from page_files import locked_pdf, page_jpeg, page_pdf, page_png
from test_app import charts, goto, make_app, no_reference, open_tab, texts, wait_for_sweep  # noqa: F401


def huge_page_pdf() -> bytes:
    """A one-page PDF whose page is 200 x 200 inches: over the pixel limit when rendered at 144 dpi."""
    buf = io.BytesIO()
    Image.new("RGB", (200, 200), "white").save(buf, format="PDF", resolution=1.0)
    return buf.getvalue()


def shown(at, kind: str) -> str:
    """The texts of one kind of element, Markdown escapes removed."""
    return " ".join(texts(at, kind)).replace("\\", "")


def start(at):
    submit = [b for b in at.get("form_submit_button") if "dataset" in b.proto.label.lower()][0]
    submit.click().run()
    assert not at.exception and not at.error, texts(at, "error")
    job = wait_for_sweep()
    assert job.kind == "dataset" and job.error is None, job.error
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return job


def series_of(chart) -> set:
    """The 'series' values (measured, analytic bound, predicted) a per-page chart carries."""
    import pyarrow as pa

    frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]
    return {s for f in frames if "series" in f for s in f["series"]}


def test_upload_pages_run_them_and_see_the_charts(no_reference):
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "Dataset runs")
    assert at.radio(key="ds_source_kind").value == "uploads"
    at.file_uploader(key="up_files").set_value([
        ("scan.png", page_png(seed=1), "image/png"),
        ("receipt.jpg", page_jpeg(), "image/jpeg"),
        ("slides.pdf", page_pdf(2), "application/pdf"),
        ("huge.pdf", huge_page_pdf(), "application/pdf"),
        ("notes.png", b"hello, I am not an image", "image/png"),
        ("locked.pdf", locked_pdf(), "application/pdf"),
        ("empty.jpg", b"", "image/jpeg"),
    ]).run()
    assert not at.exception, [e.value for e in at.exception]
    skipped = shown(at, "warning")
    assert "3 file(s) skipped" in skipped and "notes.png" in skipped and "not a page image" in skipped
    assert "locked.pdf" in skipped and "password-protected" in skipped and "empty.jpg" in skipped
    listed = shown(at, "markdown")
    for name in ("scan.png", "receipt.jpg", "slides.pdf", "huge.pdf"):
        assert name in listed, name
    assert "4 file(s), 5 page(s)" in listed
    uploads = no_reference / "uploads"
    assert sorted(p.suffix for p in uploads.iterdir()) == [".jpg", ".json", ".json", ".json", ".json", ".pdf",
                                                           ".pdf", ".png"]
    at.number_input(key="ds_tokens").set_value(2)
    at.checkbox(key="ds_trace").check()
    at.number_input(key="ds_trace_tokens").set_value(2)
    job = start(at)
    assert job.handled == 5 and job.statuses["done"] == 4 and job.statuses["error"] == 1
    run = RunStore().get_run(job.run_id)
    assert run["kind"] == "dataset" and run["n_done"] == 4 and run["meta"]["operators"]
    assert at.selectbox(key=f"ds_run_{job.run_id[:8]}").value == job.run_id
    failed = shown(at, "warning")
    assert "1 page(s) skipped or failed" in failed and "huge.pdf p1" in failed and "megapixels" in failed
    assert "synthetic (random) weights, measured on the CPU" in shown(at, "caption")
    (chart,) = charts(at)  # per page: measured points with the analytic bound through them
    assert series_of(chart) >= {"measured", "analytic bound"}
    for view, n_charts in (("Distribution", 2), ("Operators", 1)):
        open_tab(at, "ds_view", view)
        assert len(charts(at)) == n_charts, view
    assert any("trace" in b.proto.label.lower() for b in at.get("download_button"))
    open_tab(at, "ds_view", "Slowest pages")
    assert len(at.image) >= 3  # thumbnails of the slowest pages

    # a second run over the same uploads (one removed first), then the two side by side
    at.button(key=f"up_rm_{[p.stem for p in uploads.glob('*.jpg')][0]}").click().run()
    assert "3 file(s), 4 page(s)" in shown(at, "markdown")
    at.checkbox(key="ds_trace").uncheck()
    second = start(at)
    assert second.handled == 4 and second.run_id != job.run_id
    open_tab(at, "ds_view", "Compare runs")
    assert at.selectbox(key="ds_compare").value == job.run_id  # the other run (the only one)
    assert "3 shared page(s)" in shown(at, "caption")
    assert len(charts(at)) == 2


def test_path_source_still_works_and_no_uploads_is_an_error(no_reference, tmp_path):
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "Dataset runs")
    start_button = [b for b in at.get("form_submit_button") if "dataset" in b.proto.label.lower()][0]
    start_button.click().run()
    assert any("no uploaded pages chosen" in e for e in texts(at, "error"))
    at.radio(key="ds_source_kind").set_value("path").run()
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "p.png").write_bytes(page_png())
    at.text_input(key="ds_source").set_value(str(pages))
    at.number_input(key="ds_tokens").set_value(2)
    job = start(at)
    assert job.handled == 1 and RunStore().get_run(job.run_id)["meta"]["sampling"]["pages_from"] == "path"


def test_a_run_over_stored_uploads_can_be_stopped_and_keeps_its_pages(no_reference):
    """Uploads already kept (by the core, as the page keeps them) are listed; a run of 3 epochs is stopped after
    its first page: every page finished before the stop is stored, the rest never started."""
    import time

    from dsocr_core.measure.uploads import UploadStore

    ups = UploadStore(no_reference / "uploads")  # beside $DSOCR_STORE, where the page keeps them
    ups.add("a.png", page_png(seed=1))
    ups.add("b.png", page_png(seed=2))
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "Dataset runs")
    assert "2 file(s), 2 page(s)" in shown(at, "markdown")
    at.checkbox(key=f"up_use_{ups.list()[1].id}").uncheck()  # run a.png only
    at.number_input(key="ds_epochs").set_value(3)
    at.number_input(key="ds_tokens").set_value(2)
    [b for b in at.get("form_submit_button") if "dataset" in b.proto.label.lower()][0].click().run()
    from ui import sweeps

    runner = sweeps.runner()
    job = runner.job
    assert job.total == 3 and job.kind == "dataset"
    deadline = time.time() + 120
    while job.handled < 1 and job.running and time.time() < deadline:
        time.sleep(0.1)
    runner.stop()  # what the 'Stop after the current page' button does
    job = wait_for_sweep()
    assert job.stopped and job.error is None and 1 <= job.handled < 3
    run = RunStore().get_run(job.run_id)
    assert run["n_points"] == run["n_done"] == job.handled
    at.run()
    assert "Stopped" in shown(at, "warning")
    assert "a.png" in shown(at, "markdown") and f"{job.handled} / 0 / 0" in [m.value for m in at.metric][1]
