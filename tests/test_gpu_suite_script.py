"""benchmarks/gpu_suite.sh PART=K/N: the GPU tests in N shares for device calls of ten minutes (on a CPU every GPU
test skips, so the shares' sizes and the refusal of a share that does not exist are what is checked here)."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, part: str) -> tuple[int, str, str]:
    env = dict(os.environ, OUT=str(tmp_path / part.replace("/", "_")), PART=part, SKIP_SPEED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_suite.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    suite = Path(env["OUT"]) / "gpu_suite.txt"
    return done.returncode, done.stdout, suite.read_text() if suite.exists() else ""


def test_two_shares_run_every_gpu_test_once_and_a_third_of_two_is_refused(tmp_path):
    shares = []
    for part in ("1/2", "2/2"):
        code, out, suite = _run(tmp_path, part)
        assert code == 0, out
        n = int(re.search(r"part \d/2 \((\d+) tests\)", out).group(1))
        assert re.search(rf"\b{n} skipped\b", suite), suite[-300:]  # no CUDA here: each selected test skips
        selected = (tmp_path / part.replace("/", "_") / "gpu_tests_selected.txt").read_text().split()
        assert len(selected) == n
        shares.append(selected)
    collected = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q",
                                "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True).stdout
    every = [line.strip() for line in collected.splitlines() if re.match(r"^tests/\S*::", line)]
    assert shares[0] + shares[1] == every and not set(shares[0]) & set(shares[1])  # each test once, in order
    assert abs(len(shares[0]) - len(shares[1])) <= 1
    code, out, _ = _run(tmp_path, "3/2")
    assert code == 2 and "selects no GPU test" in out
