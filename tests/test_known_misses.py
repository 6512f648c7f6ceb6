"""The misses a page states beside a prediction (analytic/known_misses.py) follow the session mode, the batch and
the stages shown, as docs/accuracy.md measured them."""
from pathlib import Path

from dsocr_core.analytic.known_misses import BATCHED, BATCHED_PREFILL, PROJECTOR, REFERENCE, known_misses
from dsocr_core.calibration.profile import load_profile

H100 = load_profile(Path(__file__).resolve().parents[1] / "data" / "profiles" / "h100.json")


def test_fast_mode_at_batch_1_states_only_the_projector():
    assert known_misses(H100, "fast", 1) == [PROJECTOR]
    assert known_misses(H100, "fast", 1, stages=["decode", "prefill"]) == []


def test_batched_fast_predictions_state_the_decode_and_prefill_misses_where_those_stages_are_shown():
    assert known_misses(H100, "fast", 8) == [BATCHED, BATCHED_PREFILL, PROJECTOR]
    assert known_misses(H100, "fast", 8, stages=["prefill"]) == [BATCHED_PREFILL]
    assert known_misses(H100, "fast", 8, stages=["sam", "clip"]) == []


def test_the_reference_mode_states_its_own_misses_not_the_fast_engines():
    assert known_misses(H100, "reference", 8) == [REFERENCE, BATCHED]
