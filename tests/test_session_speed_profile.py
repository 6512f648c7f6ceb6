"""benchmarks/session_speed.py's profile section on the CPU (tiny model): `--profile` honours its batch sizes and
prompt length, and a longer prompt's kernel tables are named after it, beside the default page's."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _profile(out: Path, *args: str) -> dict:
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "session_speed.py"), "--quick", "--device", "cpu",
                    "--profile", "--no-profile-prefill", "--out", str(out / "x.json"), *args],
                   check=True, capture_output=True, timeout=600)
    return json.loads((out / "profile_summary.json").read_text())


def test_profile_takes_its_batches_and_prompt_length(tmp_path):
    default = _profile(tmp_path / "a", "--profile-batches", "2")
    longer = _profile(tmp_path / "b", "--profile-batches", "2", "--profile-text-tokens", "60")
    assert set(default) == {"decode_b2"} and set(longer) == {"decode_b2_t60"}
    assert longer["decode_b2_t60"]["prompt_tokens"] == default["decode_b2"]["prompt_tokens"] + 50
    assert (tmp_path / "b" / "profile_decode_b2_t60.txt").is_file()
    assert not (tmp_path / "a" / "profile_prefill.txt").exists()  # --no-profile-prefill
