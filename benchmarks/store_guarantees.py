"""The figures of the README's "What we guarantee": how long opening a store (with its integrity check) takes,
and the peak memory of an analytic sweep written in chunks versus built as one table.

    python benchmarks/store_guarantees.py                      # stores of 1,000 and 10,000 points; sweeps of 20k, 200k
    python benchmarks/store_guarantees.py --sweep-points 1000000 --no-whole

Each sweep runs in its own process (peak RSS is per process); its JSON goes to a temporary folder, then is deleted.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SWEEP = """
import resource, sys, time
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import PRESETS
spec, hw = PRESETS["full"](), get_hardware("h200")
grid = dict(mode="gundam", crops=[(2, 2)], text_tokens=list(range(1, {n} // 100 + 1)), batch=list(range(1, 101)),
            decode_steps=[0])
t0 = time.perf_counter()
if "{how}" == "chunked":
    from dsocr_core.results.sweep_file import write_sweep_file
    write_sweep_file(spec, hw, sys.argv[1], **grid)
else:
    from dsocr_core.analytic import Points, sweep_table, write_sweep
    write_sweep(sweep_table(spec, Points.grid(**grid), hw, with_capacity=True), sys.argv[1])
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def store_open_times(folder: Path, sizes=(1000, 10000)) -> None:
    from dsocr_core.results.store import RunStore

    store = RunStore(folder / "store.sqlite")
    run_id = store.create_run("sweep", "benchmark", {"device": "cpu"}, {"source": "none"})
    done = 0
    for n in sizes:
        with store._write() as conn:  # the rows put_point writes, inserted in bulk
            for i in range(done, n):
                conn.execute("INSERT INTO points (run_id, key, status, message, extra, updated_at) VALUES "
                             "(?, ?, 'done', '', ?, '2026-01-01T00:00:00+00:00')",
                             (run_id, f'{{"text_tokens":{i}}}', '{"note":"' + "x" * 2000 + '"}'))
        done = n
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            RunStore(store.path)
            best = min(best, time.perf_counter() - t0)
        size = store.path.stat().st_size / 1e6
        print(f"open + quick_check: {n:,} points ({size:.1f} MB): {best * 1e3:.1f} ms (best of 3)")


def sweep_memory(folder: Path, n: int, how: str) -> None:
    out = folder / f"sweep_{how}_{n}.json"
    res = subprocess.run([sys.executable, "-c", SWEEP.format(n=n, how=how), str(out)], cwd=ROOT, check=True,
                         capture_output=True, text=True)
    seconds, rss = res.stdout.split()
    print(f"sweep to JSON, {how}: {n:,} points, {float(seconds):.1f} s, peak RSS {rss} MB, "
          f"{out.stat().st_size / n / 1e3:.1f} KB per point")
    out.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep-points", type=int, nargs="*", default=[20_000, 200_000],
                    help="grid sizes (multiples of 100)")
    ap.add_argument("--no-whole", action="store_true", help="skip the whole-table comparison (needs ~14 KB/point)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_open_times(Path(tmp))
        for n in args.sweep_points:
            sweep_memory(Path(tmp), n, "chunked")
            if not args.no_whole:
                sweep_memory(Path(tmp), n, "whole")


if __name__ == "__main__":
    main()
