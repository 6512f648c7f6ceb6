"""The misses a page states beside a prediction (analytic/known_misses.py) follow the session mode, the batch and
the stages shown, as docs/accuracy.md measured them."""
from pathlib import Path

import json

from dsocr_core.analytic.known_misses import (BATCHED, BATCHED_PREFILL, EXPERT_TILE, PROJECTOR, REFERENCE,
                                              known_misses)
from dsocr_core.calibration.profile import load_profile, profile_from_dict

ROOT = Path(__file__).resolve().parents[1]
H100 = load_profile(ROOT / "data" / "profiles" / "h100.json")


def test_fast_mode_at_batch_1_states_only_the_projector():
    assert known_misses(H100, "fast", 1) == [PROJECTOR]
    assert known_misses(H100, "fast", 1, stages=["decode", "prefill"]) == []


def test_batched_fast_predictions_state_the_decode_and_prefill_misses_where_those_stages_are_shown():
    assert known_misses(H100, "fast", 8) == [BATCHED, BATCHED_PREFILL, PROJECTOR]
    assert known_misses(H100, "fast", 8, stages=["prefill"]) == [BATCHED_PREFILL]
    assert known_misses(H100, "fast", 8, stages=["sam", "clip"]) == []


def test_the_reference_mode_states_its_own_misses_not_the_fast_engines():
    assert known_misses(H100, "reference", 8) == [REFERENCE, BATCHED]


def test_batches_above_16_state_the_expert_tile_miss_while_the_profile_lacks_the_tiles():
    """The by-expert MoE kernels run token tiles of 32 and 64 at batch 17-64; a profile whose table was timed at 16
    only under-prices them, and says so there (in the fast mode, where the decode step is shown), until measured."""
    assert known_misses(H100, "fast", 32) == [BATCHED, EXPERT_TILE, BATCHED_PREFILL, PROJECTOR]
    assert known_misses(H100, "fast", 16) == [BATCHED, BATCHED_PREFILL, PROJECTOR]
    assert known_misses(H100, "fast", 64, stages=["prefill"]) == [BATCHED_PREFILL]
    assert EXPERT_TILE not in known_misses(H100, "reference", 64)
    raw = json.loads((ROOT / "data" / "profiles" / "h200.json").read_text())
    for name in ("memory.moe_gemv_combine", "memory.moe_gemv"):  # both measured with the tiles
        t = raw["tables"][name]
        raw["tables"][name] = {**t, "axes": {**t["axes"], "tokens": [16.0, 32.0, 64.0]},
                               "efficiency": [[e] * 3 for e in t["efficiency"]],
                               "measured": [[m] * 3 for m in t["measured"]]}
    assert EXPERT_TILE not in known_misses(profile_from_dict(raw), "fast", 64)
