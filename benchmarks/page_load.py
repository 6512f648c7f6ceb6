"""Time to the first chart of every dashboard page, in a real browser.

Starts `streamlit run app.py` on a free local port (a temporary run store, the bundled reference runs), opens it
in Debian's headless Chromium through Playwright (never a downloaded browser) and prints, per page:

* cold: the first visit of the page after the server started (the first page also pays the server's first script
  run: imports, the run store, the bundled-run import);
* switch: a click in the sidebar navigation from another page, the server warm (median over --rounds);
* new tab: a new tab of the same browser (its HTTP cache warm, as a user's is) opening the page's URL, the
  server warm (median over --rounds): a new Streamlit session, so the frontend boots and the script runs again;
* and, on the analytic page, a changed setting (the sweep axis) until the chart shows the new axis.

"First chart" is the first Vega-Lite chart of the new page drawn (its SVG or canvas present, its element not
stale); the parity page has no chart before a run, so its first control ("Run both paths") stands in. "Done" is
the end of the script run (the app idle). The LAST line printed is one JSON object with every figure.

    python benchmarks/page_load.py [--rounds 5] [--chromium /usr/bin/chromium] [--root CHECKOUT]

--root times another checkout of the dashboard (e.g. an older commit unpacked with `git archive`), for before/after
figures taken with the same benchmark.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# (sidebar title, url path, the page's h1, what counts as its first chart)
PAGES = [
    ("Overview", "", "DeepSeek-OCR inference cost", "chart"),
    ("Analytic sweep", "analytic", "Analytic sweep", "chart"),
    ("Measured sweep", "measured", "Measured sweep", "chart"),
    ("Vendor parity", "parity", "Vendor parity", "button:Run both paths"),
    ("MFU", "mfu", "MFU and MBU", "chart"),
]

# True when the page titled `h1` shows its first chart (or its marker control), not stale, drawn.
READY_JS = """([h1, marker]) => {
  const main = document.querySelector("[data-testid='stMain']");
  if (!main) return false;
  const fresh = (el) => { const c = el.closest('[data-stale]'); return !c || c.getAttribute('data-stale') !== 'true'; };
  const title = [...main.querySelectorAll('h1')].some(h => fresh(h) && h.innerText.trim().startsWith(h1));
  if (!title) return false;
  if (marker === 'chart') {
    return [...main.querySelectorAll("[data-testid='stVegaLiteChart']")].some(
      c => fresh(c) && c.querySelector('svg, canvas') && c.getBoundingClientRect().height > 0);
  }
  const label = marker.split(':')[1];
  return [...main.querySelectorAll('button')].some(b => fresh(b) && b.innerText.includes(label));
}"""
IDLE_JS = """() => { const a = document.querySelector("[data-testid='stApp']");
  return a && a.getAttribute('data-test-script-state') === 'notRunning'; }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, store: Path, log: Path, root: Path = ROOT) -> subprocess.Popen:
    env = {**os.environ, "DSOCR_STORE": str(store), "PYTHONUNBUFFERED": "1"}
    env.pop("DSOCR_REFERENCE_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.headless", "true",
         "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false"],
        cwd=root, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return proc
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"streamlit did not start:\n{log.read_text()[-3000:]}")


def wait_ready(page, h1: str, marker: str, t0: float) -> tuple[float, float]:
    """(seconds to the first chart, seconds to the end of the script run) since t0."""
    page.wait_for_function(READY_JS, arg=[h1, marker], timeout=180_000, polling="raf")
    first = time.perf_counter() - t0
    page.wait_for_timeout(50)
    page.wait_for_function(IDLE_JS, timeout=180_000, polling=50)
    return first, time.perf_counter() - t0


def switch_to(page, title: str, h1: str, marker: str) -> tuple[float, float]:
    link = page.locator("[data-testid='stSidebarNav'] a", has_text=title)
    t0 = time.perf_counter()
    link.click()
    return wait_ready(page, h1, marker, t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="warm rounds; medians are reported")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose app.py is timed")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="dsocr-pageload-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t_start = time.perf_counter()
    proc = start_server(port, tmp / "runs.sqlite", tmp / "server.log", args.root.resolve())
    server_s = time.perf_counter() - t_start
    out = {"server_start_s": round(server_s, 2), "cold": {}, "switch": {}, "new_tab": {}, "analytic_setting": None}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=ARGS)
            ctx = browser.new_context(viewport={"width": 1440, "height": 1200})
            page = ctx.new_page()
            # cold: the first visit of every page after the server started
            t0 = time.perf_counter()
            page.goto(url)
            out["cold"]["Overview"] = wait_ready(page, PAGES[0][2], PAGES[0][3], t0)
            for title, _, h1, marker in PAGES[1:]:
                out["cold"][title] = switch_to(page, title, h1, marker)
            # warm page switches, round robin
            switch: dict[str, list] = {t: [] for t, *_ in PAGES}
            for _ in range(args.rounds):
                for title, _, h1, marker in PAGES:
                    switch[title].append(switch_to(page, title, h1, marker))
            # a changed analytic setting: the sweep axis, until the chart's x axis names the new one
            switch_to(page, "Analytic sweep", "Analytic sweep", "chart")
            setting = []
            axes = [("Batch size", "batch size"), ("Crop count (Gundam tiles)", "crop count")]
            for axis, label in axes * args.rounds:
                t0 = time.perf_counter()
                page.locator("[data-testid='stMain'] [data-testid='stRadio'] label", has_text=axis).first.click()
                page.wait_for_function(
                    """(label) => [...document.querySelectorAll(
                         "[data-testid='stMain'] [data-testid='stVegaLiteChart']")].some(
                         c => c.innerHTML.includes(label) && !c.closest("[data-stale='true']"))""",
                    arg=label, timeout=120_000, polling="raf")
                first = time.perf_counter() - t0
                page.wait_for_function(IDLE_JS, timeout=120_000, polling=50)
                setting.append((first, time.perf_counter() - t0))
            # new tabs of the same browser on the warm server
            fresh: dict[str, list] = {t: [] for t, *_ in PAGES}
            for _ in range(args.rounds):
                for title, path, h1, marker in PAGES:
                    tab = ctx.new_page()
                    t0 = time.perf_counter()
                    tab.goto(f"{url}/{path}")
                    fresh[title].append(wait_ready(tab, h1, marker, t0))
                    tab.close()
            ctx.close()
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()

    def med(pairs):
        return [round(statistics.median(v[i] for v in pairs), 2) for i in (0, 1)]

    for title in switch:
        out["switch"][title] = med(switch[title])
        out["new_tab"][title] = med(fresh[title])
        out["cold"][title] = [round(v, 2) for v in out["cold"][title]]
    out["analytic_setting"] = med(setting)
    print(f"server start (health check answers): {server_s:.2f} s; figures: first chart / script done, seconds")
    print(f"{'page':16s} {'cold':>13s} {'switch (med)':>14s} {'new tab (med)':>16s}")
    for title in switch:
        c, s, f = out["cold"][title], out["switch"][title], out["new_tab"][title]
        print(f"{title:16s} {c[0]:6.2f}/{c[1]:<6.2f} {s[0]:7.2f}/{s[1]:<6.2f} {f[0]:9.2f}/{f[1]:<6.2f}")
    print(f"analytic setting changed (sweep axis): {out['analytic_setting'][0]:.2f} s to the new chart, "
          f"{out['analytic_setting'][1]:.2f} s to done")
    out.update(rounds=args.rounds, cpus=os.cpu_count(), python=platform.python_version())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
