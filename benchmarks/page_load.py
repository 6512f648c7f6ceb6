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

    python benchmarks/page_load.py [--rounds 5] [--cold-runs 1] [--chromium /usr/bin/chromium] [--root CHECKOUT]...

--root times a checkout of the dashboard (default: this one); given twice, e.g. with an older commit unpacked by
`git archive OLD | tar -x -C /tmp/before`, it compares them: cold runs alternate between the checkouts and every
warm round measures each in turn, so a busy shared machine weighs on both alike.
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


class Server:
    """`streamlit run app.py` of one checkout on a free port, with its own temporary run store."""

    def __init__(self, root: Path):
        self.root = root
        self.tmp = Path(tempfile.mkdtemp(prefix="dsocr-pageload-"))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        self.proc = start_server(port, self.tmp / "runs.sqlite", self.tmp / "server.log", root)
        self.start_s = time.perf_counter() - t0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cold_visits(browser, server: Server) -> dict[str, tuple[float, float]]:
    """The first visit of every page after the server started: the URL, then the sidebar links in turn."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 1200})
    page = ctx.new_page()
    out = {}
    t0 = time.perf_counter()
    page.goto(server.url)
    out["Overview"] = wait_ready(page, PAGES[0][2], PAGES[0][3], t0)
    for title, _, h1, marker in PAGES[1:]:
        out[title] = switch_to(page, title, h1, marker)
    ctx.close()
    return out


def setting_change(page) -> tuple[float, float]:
    """The analytic page's sweep axis changed (batch size <-> crop count) until the chart's x axis names it."""
    switch_to(page, "Analytic sweep", "Analytic sweep", "chart")
    x = page.locator("[data-testid='stMain'] [data-testid='stVegaLiteChart']").first.inner_html()
    axis, label = (("Crop count (Gundam tiles)", "crop count") if "batch size" in x else ("Batch size", "batch size"))
    t0 = time.perf_counter()
    page.locator("[data-testid='stMain'] [data-testid='stRadio'] label", has_text=axis).first.click()
    page.wait_for_function(
        """(label) => [...document.querySelectorAll(
             "[data-testid='stMain'] [data-testid='stVegaLiteChart']")].some(
             c => c.innerHTML.includes(label) && !c.closest("[data-stale='true']"))""",
        arg=label, timeout=120_000, polling="raf")
    first = time.perf_counter() - t0
    page.wait_for_function(IDLE_JS, timeout=120_000, polling=50)
    return first, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="warm rounds; medians are reported")
    ap.add_argument("--cold-runs", type=int, default=1, help="fresh servers per checkout for the cold figures")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--root", type=Path, action="append",
                    help="a checkout whose app.py is timed (repeat to compare checkouts; default: this one)")
    args = ap.parse_args()
    roots = [r.resolve() for r in (args.root or [ROOT])]
    from playwright.sync_api import sync_playwright

    med = lambda pairs: [round(statistics.median(v[i] for v in pairs), 2) for i in (0, 1)]  # noqa: E731
    results = {str(r): {"cold": {t: [] for t, *_ in PAGES}, "switch": {t: [] for t, *_ in PAGES},
                        "new_tab": {t: [] for t, *_ in PAGES}, "setting": [], "server_start_s": []} for r in roots}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=ARGS)
        # cold: a fresh server per checkout and run, the checkouts alternating (the same machine load for each)
        for _ in range(args.cold_runs):
            for root in roots:
                server = Server(root)
                try:
                    results[str(root)]["server_start_s"].append(server.start_s)
                    for title, v in cold_visits(browser, server).items():
                        results[str(root)]["cold"][title].append(v)
                finally:
                    server.stop()
        # warm: every checkout's server running, rounds alternating between them
        servers = [Server(root) for root in roots]
        try:
            tabs = []
            for server in servers:
                ctx = browser.new_context(viewport={"width": 1440, "height": 1200})
                page = ctx.new_page()
                page.goto(server.url)
                wait_ready(page, PAGES[0][2], PAGES[0][3], time.perf_counter())
                for title, _, h1, marker in PAGES[1:]:
                    switch_to(page, title, h1, marker)  # every page once: caches filled
                tabs.append((server, ctx, page))
            for _ in range(args.rounds):
                for server, ctx, page in tabs:
                    r = results[str(server.root)]
                    for title, _, h1, marker in PAGES:
                        r["switch"][title].append(switch_to(page, title, h1, marker))
                    r["setting"].append(setting_change(page))
                    for title, path, h1, marker in PAGES:  # a new tab of the same browser (HTTP cache warm)
                        tab = ctx.new_page()
                        t0 = time.perf_counter()
                        tab.goto(f"{server.url}/{path}")
                        r["new_tab"][title].append(wait_ready(tab, h1, marker, t0))
                        tab.close()
            for _, ctx, _ in tabs:
                ctx.close()
        finally:
            for server in servers:
                server.stop()
        browser.close()

    out = {"checkouts": {}, "rounds": args.rounds, "cold_runs": args.cold_runs, "cpus": os.cpu_count(),
           "python": platform.python_version(), "load_average_after": list(os.getloadavg())}
    for root in roots:
        r = results[str(root)]
        summary = {"server_start_s": round(statistics.median(r["server_start_s"]), 2),
                   "cold": {t: med(v) for t, v in r["cold"].items()},
                   "switch": {t: med(v) for t, v in r["switch"].items()},
                   "new_tab": {t: med(v) for t, v in r["new_tab"].items()},
                   "analytic_setting": med(r["setting"])}
        out["checkouts"][str(root)] = summary
        print(f"\n{root} (server start {summary['server_start_s']:.2f} s); first chart / script done, seconds, "
              "medians")
        print(f"{'page':16s} {'cold':>13s} {'switch':>14s} {'new tab':>16s}")
        for title, *_ in PAGES:
            c, w, f = summary["cold"][title], summary["switch"][title], summary["new_tab"][title]
            print(f"{title:16s} {c[0]:6.2f}/{c[1]:<6.2f} {w[0]:7.2f}/{w[1]:<6.2f} {f[0]:9.2f}/{f[1]:<6.2f}")
        a = summary["analytic_setting"]
        print(f"analytic setting changed (sweep axis): {a[0]:.2f} s to the new chart, {a[1]:.2f} s to done")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
