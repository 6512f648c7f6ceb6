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
