"""The misses a page states beside a prediction (analytic/known_misses.py) follow the session mode, the batch and
the stages shown, as docs/accuracy.md measured them."""
from pathlib import Path


from dsocr_core.analytic.known_misses import (BATCHED, BATCHED_PREFILL, EXPERT_TILE, PROJECTOR, REFERENCE,
                                              SPLIT_KV_FILL, known_misses)
from dsocr_core.calibration.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
H100 = load_profile(ROOT / "data" / "profiles" / "h100.json")


def test_fast_mode_at_batch_1_states_only_the_projector():
    assert known_misses(H100, "fast", 1) == [PROJECTOR]
    assert known_misses(H100, "fast", 1, stages=["decode", "prefill"]) == []


def test_batched_fast_predictions_state_the_decode_and_prefill_misses_where_those_stages_are_shown():
    assert known_misses(H100, "fast", 8) == [BATCHED, SPLIT_KV_FILL, BATCHED_PREFILL, PROJECTOR]
    assert known_misses(H100, "fast", 8, stages=["prefill"]) == [BATCHED_PREFILL]
    assert known_misses(H100, "fast", 8, stages=["sam", "clip"]) == []


def test_the_reference_mode_states_its_own_misses_not_the_fast_engines():
    assert known_misses(H100, "reference", 8) == [REFERENCE, BATCHED]


def test_batches_above_16_state_the_expert_tile_miss_while_the_profile_lacks_the_tiles():
    """The by-expert MoE kernels run token tiles of 32 and 64 at batch 17-64; a profile whose table was timed at 16
    only under-prices them, and says so there (in the fast mode, where the decode step is shown), until measured."""
    assert known_misses(H100, "fast", 32) == [BATCHED, EXPERT_TILE, SPLIT_KV_FILL, BATCHED_PREFILL, PROJECTOR]
    assert known_misses(H100, "fast", 16) == [BATCHED, SPLIT_KV_FILL, BATCHED_PREFILL, PROJECTOR]
    assert known_misses(H100, "fast", 64, stages=["prefill"]) == [BATCHED_PREFILL]
    assert EXPERT_TILE not in known_misses(H100, "reference", 64)
    # the H200's, measured with the tiles on 2026-11-28 (16:34); the same profile before that states it
    assert EXPERT_TILE not in known_misses(load_profile(ROOT / "data" / "profiles" / "h200.json"), "fast", 64)
    before = load_profile(ROOT / "data" / "profiles" / "history" / "h200_2026-11-28.json")
    assert EXPERT_TILE in known_misses(before, "fast", 64)


def test_batched_fast_predictions_state_the_split_kv_fill_miss_while_the_profile_lacks_it():
    """The split-KV decode attention's grid covers the static cache to its bucket's end; a profile that timed it
    with the cache ending at the position under-prices short contexts, and says so wherever the decode step of a
    batched fast prediction is shown, until measured (the H200's, 2026-11-28 17:06)."""
    before = load_profile(ROOT / "data" / "profiles" / "history" / "h200_2026-11-28_1634.json")
    assert SPLIT_KV_FILL in known_misses(before, "fast", 2)
    assert SPLIT_KV_FILL not in known_misses(before, "fast", 1)  # the fused batch-1 step has its own attention
    assert SPLIT_KV_FILL not in known_misses(before, "fast", 8, stages=["sam", "prefill"])
    assert SPLIT_KV_FILL not in known_misses(before, "reference", 8)
    assert SPLIT_KV_FILL not in known_misses(load_profile(ROOT / "data" / "profiles" / "h200.json"), "fast", 64)


def test_the_reference_miss_states_its_own_host_cost_sets_figures_as_they_give_them_now():
    """The reference mode's text names the held-out H200 sets with that machine's host costs (seed 99, DeepSeek-OCR;
    seed 100, DeepSeek-OCR 2) with the figures the shipped results give under the current model (rounded to a whole
    percent), so the two cannot drift apart."""
    import re
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from test_prediction_regression import accuracy_summary

    common = (("TTFT", "ttft"), ("the LM prefill", "prefill"), ("decode", "decode"), ("TPOT", "tpot"),
              ("the projector", "projector"))
    sets = {"seed 99": ("h200_prediction_accuracy_random99_reference_2026-11-28.json",
                        common + (("SAM", "sam"), ("CLIP", "clip"), ("vision", "vision"))),
            "DeepSeek-OCR 2": ("h200_prediction_accuracy_v2_random100_reference_2026-11-28.json",
                               common + (("the encoder", "encoder"),))}
    for marker, (file, names) in sets.items():
        summary, _ = accuracy_summary(file, "reference", None)
        text = REFERENCE[REFERENCE.index(marker):]
        for name, stage in names:
            stated = re.search(re.escape(name) + r" (\d+)%", text)
            assert stated, (marker, name)
            assert int(stated.group(1)) == round(summary[stage]["median_abs"] * 100), (marker, name, summary[stage])
