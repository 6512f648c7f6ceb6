"""End to end: `streamlit run app.py` in a subprocess, driven by Playwright in Debian's headless Chromium.

Opens every page from the sidebar navigation, changes a control and sees a chart update, picks a calibration
profile and sees the predicted series beside the roofline, uploads a sample page on the parity page and sees both
renderings. Screenshots of every page go to a temporary folder, or to
docs/screenshots/ when DSOCR_SCREENSHOTS=1 (how the README's pictures are made).
Never downloads a browser: without /usr/bin/chromium these tests are skipped.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"
CHART = "[data-testid='stVegaLiteChart']"
LABEL = "synthetic tiny model on CPU (random weights)"
SERVED: dict[str, Path] = {}  # what the server fixture serves: {"store": its run store file}

if not CHROMIUM.exists():
    why = os.environ.get("DSOCR_BROWSER_SKIP_REASON")  # set by ./run-tests when it could not install Chromium
    pytest.skip(f"needs Debian's Chromium at /usr/bin/chromium (apt-get install chromium){': ' + why if why else ''};"
                " browsers are never downloaded", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (requirements.txt)")

from servers import free_port, wait_until_served  # noqa: E402 - tests/servers.py, after the skips


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    port = free_port()
    env = {**os.environ, "DSOCR_STORE": str(tmp / "runs.sqlite"), "PYTHONUNBUFFERED": "1"}
    SERVED["store"] = tmp / "runs.sqlite"
    # a quick CPU profile as the sidebar's "Test the calibration" saves it (a few seconds): never offered
    from dsocr_core.calibration.microbench import run_microbench

    run_microbench("cpu", quick=True, budget_s=60).save(tmp / "calibrated_profiles" / "cpu_quick.json")
    env.pop("DSOCR_REFERENCE_DIR", None)  # the bundled data/reference runs, as users get them
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.headless", "true",
         "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_served(proc, url, tmp / "server.log", 90, "streamlit")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1500})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    if os.environ.get("DSOCR_SCREENSHOTS") == "1":
        folder = ROOT / "docs" / "screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return tmp_path_factory.mktemp("screenshots")


def settle(page) -> None:
    """Wait until the script run triggered by the last action has finished."""
    page.wait_for_timeout(400)
    page.wait_for_selector(IDLE, timeout=120_000)
    page.wait_for_timeout(300)


def open_page(page, url: str, title: str) -> None:
    """Go to the app and open a page from the sidebar navigation, as a user would."""
    if not page.url.startswith(url):
        page.goto(url)
        settle(page)
    page.locator("[data-testid='stSidebarNav'] a", has_text=title).click()
    settle(page)


def snap(page, shots: Path, name: str, height: int = 1500) -> Path:
    """A screenshot of the window, made `height` pixels tall so the page's charts are in it."""
    path = shots / f"{name}.png"
    page.set_viewport_size({"width": 1440, "height": height})
    page.wait_for_timeout(700)
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1440, "height": 1500})
    assert path.stat().st_size > 10_000
    return path


def main_text(page) -> str:
    return page.locator("[data-testid='stMain']").inner_text()


def has_reference_runs() -> bool:
    return any((ROOT / "data" / "reference").glob("*.json"))


def test_overview(page, server, shots):
    page.goto(server)
    settle(page)
    page.get_by_text("Parameters by group").wait_for()
    text = main_text(page)
    assert "DeepSeek-OCR inference cost" in text and "Ceilings in use" in text
    assert LABEL in text
    # the chart library loads lazily, so on a cold server the chart can trail the text: wait for it
    sync_api.expect(page.locator(f"[data-testid='stMain'] {CHART}")).to_have_count(1, timeout=30_000)
    assert page.locator("[data-testid='stSidebar']").get_by_text("Model source").is_visible()
    snap(page, shots, "overview")


def test_analytic_chart_follows_a_control(page, server, shots):
    open_page(page, server, "Analytic sweep")
    chart = page.locator(CHART).first
    chart.wait_for()
    points = chart.locator("g.mark-line path, g.mark-symbol path")
    before = chart.inner_html()
    assert "crop count" in chart.inner_text() or "crop count" in before
    snap(page, shots, "analytic", 1400)
    page.locator("[data-testid='stRadio'] label", has_text="Batch size").click()
    settle(page)
    chart = page.locator(CHART).first
    page.wait_for_function(
        "() => document.querySelector(\"[data-testid='stVegaLiteChart']\").innerHTML.includes('batch size')")
    after = chart.inner_html()
    assert after != before and "batch size" in after
    assert points.count() > 0
    page.get_by_role("tab", name="Roofline").click()  # only the open tab is drawn: opening one reruns the page
    settle(page)
    sync_api.expect(page.locator(f"[data-testid='stMain'] {CHART}")).to_have_count(1, timeout=30_000)
    page.get_by_text("Stages on the roofline").first.wait_for()
    snap(page, shots, "analytic_roofline", 2000)


def test_analytic_predicted_series_from_a_chosen_profile(page, server, shots):
    open_page(page, server, "Analytic sweep")
    side = page.locator("[data-testid='stSidebar']")
    side.get_by_role("combobox", name="Calibration profile").click()
    shipped = page.get_by_role("option", name=re.compile(r"^h200\.json "))
    shipped.wait_for()  # the list is drawn: the quick profile saved above is not in it (a smoke test, no predictor)
    assert page.get_by_role("option", name=re.compile("cpu_quick")).count() == 0
    shipped.click()
    settle(page)
    side.get_by_text(re.compile(r"NVIDIA H200 profile, measured 2026-11-23")).wait_for()
    page.get_by_role("tab", name="Time").click()
    settle(page)
    page.wait_for_function(  # the legend of the time chart names both series
        """() => [...document.querySelectorAll("[data-testid='stMain'] [data-testid='stVegaLiteChart']")].some(
             c => c.innerHTML.includes('predicted') && c.innerHTML.includes('roofline'))""")
    text = main_text(page)
    assert "Predicted with" in text and "No prediction" not in text
    snap(page, shots, "analytic_predicted", 1400)


def test_models_compared_overlays_both_models(page, server, shots):
    """The analytic page's v1-vs-v2 tab: both models' stages of the same page in one chart and the summary table;
    then DeepSeek-OCR 2 picked in the sidebar drives the sweep (its encoder stage)."""
    open_page(page, server, "Analytic sweep")
    page.get_by_role("tab", name="Models compared").click()
    settle(page)
    page.wait_for_function(  # the legend names both models
        """() => [...document.querySelectorAll("[data-testid='stMain'] [data-testid='stVegaLiteChart']")].some(
             c => c.innerHTML.includes('DeepSeek-OCR 2') && c.innerHTML.includes('encoder'))""")
    text = main_text(page)
    assert "545 image slots" in text and "Every page, both models" in text
    snap(page, shots, "models_compared", 1600)
    side = page.locator("[data-testid='stSidebar']")
    side.get_by_role("combobox", name="Model").click()
    page.get_by_role("option", name="DeepSeek-OCR 2").click()
    settle(page)
    assert "DeepSeek-OCR 2 runs in the reference mode" in side.inner_text()
    page.get_by_role("tab", name="FLOPs").click()
    settle(page)
    page.wait_for_function(
        "() => document.querySelector(\"[data-testid='stMain'] [data-testid='stVegaLiteChart']\").innerHTML"
        ".includes('encoder')")
    side.get_by_role("combobox", name="Model").click()  # back to the default model for the tests after this one
    page.get_by_role("option", name="DeepSeek-OCR", exact=True).click()
    settle(page)


def test_measured(page, server, shots):
    open_page(page, server, "Measured sweep")
    text = main_text(page)
    if has_reference_runs():
        page.locator(f"[data-testid='stMain'] {CHART}").first.wait_for()
        assert "bundled reference run" in text
    else:
        assert "No bundled reference runs yet" in text
    snap(page, shots, "measured", 1600)


def test_parity_upload_shows_both_renderings(page, server, shots):
    open_page(page, server, "Vendor parity")
    assert LABEL in main_text(page)
    page.locator("[data-testid='stRadio'] label", has_text="Upload page images").click()
    settle(page)
    inputs = page.locator("[data-testid='stFileUploaderDropzoneInput']")
    inputs.nth(0).set_input_files(str(ROOT / "data" / "samples" / "card.png"))
    page.locator("[data-testid='stFileChipName']", has_text="card.png").wait_for()  # uploaded, listed
    settle(page)
    inputs.nth(1).set_input_files(str(ROOT / "data" / "samples" / "card.grounding.txt"))  # as a vendor output
    page.locator("[data-testid='stFileChipName']", has_text="card.grounding.txt").wait_for()
    settle(page)
    page.get_by_role("button", name="Run both paths").click()
    page.get_by_text("Parity passed").wait_for(timeout=120_000)
    settle(page)
    # the three renderings (their captions appear with the images, which can trail the text on a busy machine)
    sync_api.expect(page.locator("[data-testid='stMain'] [data-testid='stImageCaption']")).to_have_count(
        3, timeout=60_000)
    captions = page.locator("[data-testid='stImageCaption']").all_inner_texts()
    assert any(c.startswith("one-shot:") for c in captions), captions
    assert any(c.startswith("separated:") for c in captions), captions
    assert any(c.startswith("vendor output:") for c in captions), captions
    assert page.locator("[data-testid='stMain'] [data-testid='stImage'] img").count() >= 3
    assert "First divergence: none" in main_text(page)
    snap(page, shots, "parity", 2100)


def test_profile_uploaded_pages(page, server, shots):
    """Issue 18: upload generated pages, a PDF and bad files on the measured page's 'Dataset runs' tab, see the
    bad ones listed with the reason, run a short dataset run of the tiny model on the CPU, see the charts."""
    from page_files import locked_pdf, page_jpeg, page_pdf, page_png

    open_page(page, server, "Measured sweep")
    page.get_by_role("tab", name="Dataset runs").click()
    settle(page)
    files = [("scan.png", "image/png", page_png(seed=1)), ("receipt.jpg", "image/jpeg", page_jpeg()),
             ("slides.pdf", "application/pdf", page_pdf(2)), ("notes.png", "image/png", b"not an image at all"),
             ("locked.pdf", "application/pdf", locked_pdf())]
    page.locator("[data-testid='stFileUploaderDropzoneInput']").first.set_input_files(
        [{"name": n, "mimeType": m, "buffer": b} for n, m, b in files])
    main = page.locator("[data-testid='stMain']")
    main.get_by_text("2 file(s) skipped").wait_for(timeout=60_000)
    main.get_by_text("3 file(s), 4 page(s)", exact=False).wait_for(timeout=60_000)
    settle(page)
    text = main_text(page)
    assert "notes.png: not a page image or a PDF" in text and "locked.pdf: the PDF is password-protected" in text
    tokens = page.get_by_label("Max new tokens")
    tokens.fill("2")
    tokens.press("Tab")
    page.get_by_role("button", name="Start dataset run").click()  # Gundam mode by default: crop tiles
    main.get_by_text("Finished (reference session mode)").wait_for(timeout=400_000)
    settle(page)
    # the run is shown: per-page stage times with the analytic bound through them (one chart, a panel per stage)
    sync_api.expect(main.locator(CHART)).to_have_count(1, timeout=60_000)
    main.get_by_text("Analytic bound: the roofline of").wait_for()
    text = main_text(page)
    assert "Done / error / oom" in text
    # bounded by this CPU's own ceilings, measured with the run in its dtype, and below every measured point
    assert "(measured with the run)" in text and "The analytic bound lies above measured points" not in text
    picker = main.locator("[data-testid='stSelectbox']", has_text="Dataset run").evaluate(  # the shown choice
        "e => e.textContent + ' ' + [...e.querySelectorAll('input')].map(i => i.value || i.placeholder).join(' ')")
    assert "[dataset run] · reference session mode" in picker and " points]" not in picker, picker
    assert_no_point_beats_its_bound(SERVED["store"])
    snap(page, shots, "dataset", 2300)
    page.get_by_role("tab", name="Distribution").click()
    settle(page)
    sync_api.expect(main.locator(CHART)).to_have_count(2, timeout=60_000)  # the spread per stage, TTFT / TPOT
    page.get_by_role("tab", name="Slowest pages").click()
    settle(page)
    sync_api.expect(main.locator("[data-testid='stImage'] img")).to_have_count(4, timeout=60_000)


def assert_no_point_beats_its_bound(store_file: Path) -> None:
    """Every stage of every page of the newest dataset run in the store is measured at or above its bound (the
    run's stored CPU ceilings): a lower bound can never exceed a measurement."""
    from dsocr_core.results import dataset_stats, page_costs
    from dsocr_core.results.store import RunStore
    from dsocr_core.spec import Hardware

    store = RunStore(store_file)
    run = store.get_run(store.list_runs(kind="dataset")[0]["id"])
    ceilings = Hardware(**run["meta"]["calibration"])
    assert ceilings.name.startswith("CPU (float32"), ceilings.name
    long = page_costs.page_stage_long(dataset_stats.page_table(store, run["id"], ceilings))
    assert long["analytic_s"].notna().all() and len(long)
    below = long[long["measured_s"] < long["analytic_s"]]
    assert below.empty, below[["label", "stage", "measured_s", "analytic_s"]]


PAGES = [("Overview", "DeepSeek-OCR inference cost"), ("Analytic sweep", "Analytic sweep"),
         ("Measured sweep", "Measured sweep"), ("Vendor parity", "Vendor parity"), ("MFU", "MFU and MBU")]


def test_every_page_loads_offline(browser, server):
    """Nothing is fetched from outside the machine (the page icon used to come from a font CDN)."""
    context = browser.new_context(viewport={"width": 1440, "height": 1500})
    outside = []
    context.on("request", lambda r: outside.append(r.url) if not r.url.startswith(("http://127.0.0.1", "data:",
                                                                                    "blob:")) else None)
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    try:
        for title, h1 in PAGES:
            open_page(pg, server, title)
            pg.get_by_role("heading", name=h1).first.wait_for()
        assert pg.get_by_role("button", name="Deploy").count() == 0  # a local tool: no Deploy button
        icon = pg.locator("link[rel~='icon']").first.get_attribute("href") or ""
        assert not icon.startswith("http") or icon.startswith(server), icon
    finally:
        context.close()
    assert not outside, outside


def test_page_switch_shows_the_first_chart_quickly(page, server):
    """The page-switch time the issue measured (benchmarks/page_load.py prints the full table). The bound here is
    loose, for a busy CI machine; the target, under 1 s on an idle 2-core machine, is what the benchmark checks."""
    open_page(page, server, "Overview")
    open_page(page, server, "Analytic sweep")
    open_page(page, server, "Overview")
    start = time.perf_counter()
    page.locator("[data-testid='stSidebarNav'] a", has_text="Analytic sweep").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll("[data-testid='stMain'] [data-testid='stVegaLiteChart']")].some(
             c => !c.closest("[data-stale='true']") && c.querySelector('svg, canvas')) &&
           [...document.querySelectorAll("[data-testid='stMain'] h1")].some(h => h.innerText.startsWith('Analytic'))""",
        polling="raf")
    elapsed = time.perf_counter() - start
    print(f"page switch to the analytic page: first chart after {elapsed:.2f} s")
    assert elapsed < 5.0


def test_mfu(page, server, shots):
    open_page(page, server, "MFU")
    if has_reference_runs():
        sync_api.expect(page.locator(f"[data-testid='stMain'] {CHART}")).to_have_count(3, timeout=30_000)
        assert "Analytic vs measured" in main_text(page)
    snap(page, shots, "mfu", 1800)
