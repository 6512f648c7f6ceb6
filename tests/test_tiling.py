"""Modes, the vendor tile-grid choice (closest aspect; 2..9 tiles under HF, 2..6 under vLLM) and token counts."""
import pytest

from dsocr_core.spec import SpecError, Workload
from dsocr_core.tiling import (HF_CROP_RANGE, MODES, VLLM_CROP_RANGE, build_image_shapes_db, candidate_grids,
                               choose_grid, crop_grid, images_seq_mask, most_square_grid, query_image_shapes,
                               sequence_length, slot_layout, token_counts, valid_tokens, workload_tokens)


@pytest.mark.parametrize("mode,features,slots", [("tiny", 64, 73), ("small", 100, 111), ("base", 256, 273),
                                                 ("large", 400, 421)])
def test_untiled_modes(mode, features, slots):
    tc = token_counts(mode)
    assert (tc.vision_features, tc.image_slots, tc.n_tiles) == (features, slots, 0)


@pytest.mark.parametrize("grid,slots", [((1, 1), 273), ((2, 1), 483), ((2, 2), 693), ((3, 2), 893), ((4, 2), 1093),
                                        ((2, 3), 273 + 30 * 21)])
def test_gundam_slots(grid, slots):
    tc = token_counts("gundam", grid)
    assert tc.image_slots == slots
    n = grid[0] * grid[1] if grid != (1, 1) else 0
    assert tc.vision_features == 256 + 100 * n and tc.n_tiles == n


def test_gundam_m_features():
    tc = token_counts("gundam-m", (2, 2))
    assert tc.vision_features == 4 * 256 + 400
    assert tc.image_slots == 421 + 32 * 33


def test_prompt_of_a_2x2_page_is_703():
    assert sequence_length(Workload(crops=(2, 2), text_tokens=10)) == 703


# (width, height) -> grid under the HF range 2..9 and the vLLM range 2..6, worked out by hand from the rule:
# closest i/j to w/h among candidates sorted by i*j; on an exact tie the later one wins if w*h > 0.5*640^2*i*j.
TILE_TABLE = [
    ((1920, 1080), (4, 2), (2, 1)),  # ratio 2 ties between 2x1 and 4x2; the page is large enough for 4x2
    ((1280, 640), (2, 1), (2, 1)),  # the same tie, but too small for 4x2
    ((1240, 1754), (2, 3), (2, 3)),  # A4 portrait at 150 dpi: 0.707 -> 2/3
    ((1000, 1000), (2, 2), (2, 2)),  # square tie 2x2 / 3x3, too small for 3x3
    ((2000, 2000), (3, 3), (2, 2)),  # large square: 3x3 under 2..9, 3x3 is not a 2..6 candidate
    ((3000, 1000), (3, 1), (3, 1)),
    ((700, 2000), (1, 3), (1, 3)),
    ((641, 100), (6, 1), (6, 1)),  # one side just above 640 is enough to tile
    ((5000, 500), (9, 1), (6, 1)),
]


@pytest.mark.parametrize("size,hf,vllm", TILE_TABLE)
def test_tile_choice_table(size, hf, vllm):
    assert crop_grid(*size, "gundam", *HF_CROP_RANGE) == hf
    assert crop_grid(*size, "gundam", *VLLM_CROP_RANGE) == vllm


def test_small_pages_and_untiled_modes_get_no_tiles():
    assert crop_grid(640, 640) == (1, 1) and crop_grid(300, 500) == (1, 1)
    for mode in ("tiny", "small", "base", "large"):
        assert crop_grid(4000, 1000, mode) == (1, 1)
    assert workload_tokens(Workload(image_size=(1920, 1080), max_crops=6)).image_slots == 483
    assert workload_tokens(Workload(image_size=(1920, 1080))).image_slots == 1093
    assert workload_tokens(Workload(mode="base", image_size=(1920, 1080))).image_slots == 273


def test_candidate_grids():
    grids = candidate_grids(2, 6)
    assert all(2 <= i * j <= 6 for i, j in grids) and len(grids) == len(set(grids))
    assert [i * j for i, j in grids] == sorted(i * j for i, j in grids)
    assert (3, 2) in grids and (2, 3) in grids and (1, 1) not in grids and (4, 2) not in grids
    with pytest.raises(SpecError):
        candidate_grids(5, 3)
    assert choose_grid(100, 100, 1, 1) == (1, 1)


@pytest.mark.parametrize("mode,grid", [("tiny", (1, 1)), ("gundam", (1, 1)), ("gundam", (3, 2)),
                                       ("gundam-m", (2, 3))])
def test_slot_layout_adds_up(mode, grid):
    tc = token_counts(mode, grid)
    runs = slot_layout(tc)
    assert sum(n for _, n in runs) == tc.image_slots
    assert runs[-1] == ("separator", 1)
    assert sum(n for kind, n in runs if kind in ("local", "global")) == tc.vision_features
    if tc.n_tiles:
        assert runs[0] == ("local", grid[0] * MODES[mode].tile_size // 64)


def test_mask_and_helpers():
    mask = images_seq_mask(1, 693, 9)
    assert mask.sum() == 693 and len(mask) == 703 and not mask[0] and mask[1] and not mask[-1]
    assert valid_tokens(256, 1000, 500) == 128
    assert valid_tokens(256, 800, 800) == 256
    assert most_square_grid(6) == (3, 2) and most_square_grid(7) == (7, 1) and most_square_grid(9) == (3, 3)


@pytest.mark.parametrize("call", [
    lambda: token_counts("gundam", (0, 2)),
    lambda: token_counts("base", (2, 2)),
    lambda: token_counts("gundam", (40, 40)),
    lambda: token_counts("huge"),
    lambda: crop_grid(0, 100),
    lambda: valid_tokens(10, -1, 5),
    lambda: most_square_grid(0),
    lambda: images_seq_mask(-1, 2, 3),
])
def test_bad_token_inputs_raise(call):
    with pytest.raises(SpecError):
        call()


def test_image_shapes_db(tmp_path):
    path = tmp_path / "shapes.sqlite"
    assert build_image_shapes_db(path, max_crops=12) == 12
    rows = query_image_shapes(path)
    assert [r["crops"] for r in rows] == list(range(1, 13))
    four = rows[3]
    assert (four["grid_w"], four["grid_h"], four["image_slots"], four["sequence"]) == (2, 2, 693, 703)
    assert [r["crops"] for r in query_image_shapes(path, vendor_only=True)] == list(range(2, 10))
    with pytest.raises(SpecError):
        query_image_shapes(tmp_path / "missing.sqlite")
