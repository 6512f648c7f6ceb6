"""What a prediction says about the tables it was priced on: the notes of one batched decode step's prediction
under a raw profile, that name one table. Shared by the tests of the axes a table gained after profiles were
measured (the MoE kernels' token tile, the split-KV attention's fill)."""
from __future__ import annotations

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.predict import with_profile
from dsocr_core.calibration.profile import profile_from_dict
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import ModelSpec


def table_notes(raw: dict, table: str, engine, batch: int, **page) -> list[str]:
    """The notes naming `table` of an H200 prediction of one decode step at `batch` (the page: Points.grid's mode or
    crops), with the profile `raw` (a profile's dict) and the engine description `engine`."""
    pts = Points.grid(text_tokens=[10], batch=[batch], decode_steps=[1], logits="last", **page)
    hw = with_profile(get_hardware("h200"), profile_from_dict(raw), engine)
    evaluate(ModelSpec(), pts, hw)
    return [n for n in hw.prediction.notes if n.startswith(table)]
