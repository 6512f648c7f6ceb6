"""Parity run on a tiny synthetic model (CPU): both paths, token equality, detection comparison."""
import json

import pytest

from dsocr_core.measure.parity_run import run_parity
from dsocr_core.grounding.samples import sample_grounding, sample_pages
from dsocr_core.runtime.session import Session


@pytest.fixture(scope="module")
def session():
    return Session.load(synthetic="tiny", device="cpu", dtype="float32")


def page(name):
    return next(p for p in sample_pages() if p.stem == name)


def test_parity_report_on_a_sample_page(session):
    vendor = sample_grounding("card")
    report = run_parity(session, page("card"), mode="gundam", max_new_tokens=20, vendor_text=vendor,
                        image_name="card")
    assert report.token_equal and report.passed
    assert report.detections.token_divergence is None
    names = [o.name for o in report.detections.outputs]
    assert names == ["one-shot", "separated", "vendor"]
    assert report.detections.outputs[2].blocks > 0  # the vendor reference has blocks, random weights have none
    pair = report.detections.pair("one-shot", "separated")
    assert pair.identical_text
    d = json.loads(report.to_json())
    assert d["passed"] and d["timings"]["separated"]["tokens"] == 20
    assert any("synthetic" in n for n in d["notes"])
    rend = report.renderings(__import__("PIL.Image", fromlist=["Image"]).open(page("card")))
    assert set(rend) == {"one-shot", "separated", "vendor"}
    assert rend["vendor"].boxes_image.size == (620, 440)


def test_divergence_evidence_tells_a_rounding_tie_from_a_real_difference():
    """When the paths' tokens part, the report says whether the separated engine, fed the reference's tokens,
    disagrees only where the two best scores are within rounding, or somewhere a real difference decides."""
    from dsocr_core.measure.parity_run import divergence_evidence
    from dsocr_core.runtime.inputs import synthetic_inputs
    from dsocr_core.runtime.session import Session

    session = Session.load(synthetic="tiny", device="cpu", dtype="float32", session_mode="fast")
    inputs = session.to_device(synthetic_inputs("tiny", (1, 1), 10, 1))
    same = divergence_evidence(session, inputs, 6)
    assert same["all_rounding_ties"] and same["teacher_forced"]["agree"] == 6
    exact = session.engine.decode_step

    def favours_token_7(token, cache):  # a real bug: one token wins every decode step by far
        logits = exact(token, cache).clone()
        logits[:, 7] += 100.0
        return logits

    session.engine.decode_step = favours_token_7
    bad = divergence_evidence(session, inputs, 6)
    assert not bad["all_rounding_ties"] and bad["teacher_forced"]["agree"] < 6
    assert "NOT a rounding tie" in bad["summary"]
