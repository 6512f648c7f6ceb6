"""benchmarks/session_speed.py's profile section on the CPU (tiny model): `--profile` honours its batch sizes and
prompt length, runs nothing else and leaves --out's file alone, and a longer prompt's kernel tables are named
after it, beside the default page's in the same folder."""
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
    default = _profile(tmp_path, "--profile-batches", "2")
    both = _profile(tmp_path, "--profile-batches", "2", "--profile-text-tokens", "60")  # the same folder
    assert set(default) == {"decode_b2"} and set(both) == {"decode_b2", "decode_b2_t60"}
    assert both["decode_b2_t60"]["prompt_tokens"] == both["decode_b2"]["prompt_tokens"] + 50
    assert (tmp_path / "profile_decode_b2.txt").is_file() and (tmp_path / "profile_decode_b2_t60.txt").is_file()
    assert not (tmp_path / "profile_prefill.txt").exists()  # --no-profile-prefill
    assert not (tmp_path / "x.json").exists()  # no other section ran, no figures file was written
