"""Operator breakdown per stage: a real torch.profiler pass on the CPU (tiny random model, a sample page), and the
grouping rules on hand-made events, CUDA kernels included."""
import csv
import json
from types import SimpleNamespace

import pandas as pd
import pytest
from torch.autograd import DeviceType

from dsocr_core.measure.datasets import discover, sample
from dsocr_core.measure.operators import (OTHERS, OUTSIDE, PAGE_PREFIX, RANGE_PREFIX, UNTRACED, OperatorProfile,
                                  ProfiledStageTimer, group_events, profile_operators, top_operators)
from dsocr_core.measure.dataset_run import ProfileSettings
from dsocr_core.grounding.samples import sample_pages
from dsocr_core.runtime.session import Session

SAMPLES = {p.stem: p for p in sample_pages()}


@pytest.fixture(scope="module")
def session():
    return Session.load(synthetic="tiny", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def profile(session, tmp_path_factory):
    ds = discover(SAMPLES["card"].parent)
    samples = sample([p for p in ds.pages if p.name == "card.png"], epochs=2)
    out = tmp_path_factory.mktemp("ops")
    return profile_operators(session, samples, ProfileSettings(mode="tiny"), n_pages=2, max_new_tokens=4,
                             out_dir=out)


def test_profile_covers_every_stage_once_per_range(profile):
    cpu = profile.stages[profile.stages["device"] == "cpu"].set_index("stage")
    assert {"preprocess", "sam", "clip", "projector", "prefill", "decode", OUTSIDE} <= set(cpu.index)
    assert cpu.loc["decode", "ranges"] == 3  # 4 tokens: the first from the prefill, then 3 decode steps
    # prefill: the LM over the prompt, then the first token's choice (part of the time to first token)
    assert cpu.loc["sam", "ranges"] == 1 and cpu.loc["prefill", "ranges"] == 2
    assert profile.pages == ["card.png"]  # a page again in a later epoch is not profiled twice
    assert (profile.operators["device"] == "cpu").all()  # no CUDA rows on a CPU run


def test_stage_shares_sum_to_the_stage_totals(profile):
    ops, stages = profile.operators, profile.stages.set_index(["stage", "device"])
    for (stage, device), group in ops.groupby(["stage", "device"]):
        total = stages.loc[(stage, device), "total_us"]
        assert group["self_us"].sum() == pytest.approx(total, rel=1e-9)
        assert group["share"].sum() == pytest.approx(1.0, abs=1e-9)
        assert (group["stage_total_us"] == total).all()
        assert list(group["rank"]) == list(range(1, len(group) + 1))
        assert group["self_us"].is_monotonic_decreasing
        if stage != OUTSIDE:  # the operators' self times add up to the ranges' own duration, within rounding
            assert total == pytest.approx(stages.loc[(stage, device), "range_us"], rel=1e-6, abs=0.01)
    sam = ops[ops["stage"] == "sam"]
    assert UNTRACED in set(sam["operator"]) and sam["operator"].str.startswith("aten::").any()
    prefill = ops[ops["stage"] == "prefill"]
    assert prefill.iloc[0]["operator"] in {"aten::mm", "aten::addmm", "aten::bmm"}  # the LM's matmuls lead


def test_top_operators_fold_the_rest_and_keep_the_sums(profile):
    top = top_operators(profile.operators, 3)
    for (stage, device), group in top.groupby(["stage", "device"]):
        full = profile.operators[(profile.operators["stage"] == stage) & (profile.operators["device"] == device)]
        assert len(group) == min(len(full), 4)
        assert group["self_us"].sum() == pytest.approx(full["self_us"].sum())
        assert group["share"].sum() == pytest.approx(1.0)
        assert group["calls"].sum() == full["calls"].sum()
        if len(full) > 3:
            assert group.iloc[-1]["operator"] == OTHERS


def test_files_and_meta_round_trip(profile):
    files = profile.files
    trace = json.loads(open(files["trace"], encoding="utf-8").read())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {RANGE_PREFIX + s for s in ("sam", "clip", "projector", "prefill", "decode", "preprocess")} <= names
    assert PAGE_PREFIX + "card.png" in names
    with open(files["operators_csv"], newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(profile.operators) and set(rows[0]) == set(profile.operators.columns)
    meta = json.loads(json.dumps(profile.to_meta(top=5)))  # what the run store keeps
    back = OperatorProfile.from_meta(meta)
    pd.testing.assert_frame_equal(back.operators, top_operators(profile.operators, 5), check_dtype=False)
    pd.testing.assert_frame_equal(back.stages, profile.stages, check_dtype=False)
    assert back.pages == profile.pages and back.files == profile.files


def test_profiled_timer_still_times(session):
    timer = ProfiledStageTimer(session.device)
    with timer.stage("sam"):
        pass
    assert [name for name, _ in timer.finish()] == ["sam"]


def test_no_readable_page_is_an_error(session, tmp_path):
    (tmp_path / "bad.png").write_bytes(b"nope")
    with pytest.raises(ValueError, match="no readable page"):
        profile_operators(session, sample(discover(tmp_path).pages), ProfileSettings(mode="tiny"))


# ---------------------------------------------------------------------------------------------- rules, by hand
def ev(name, start, end, parent=None, kernels=(), device=DeviceType.CPU, is_async=False):
    e = SimpleNamespace(name=name, device_type=device, is_async=is_async, cpu_parent=parent, cpu_children=[],
                        kernels=[SimpleNamespace(name=k, duration=d) for k, d in kernels], start=start, end=end)
    e.cpu_time_total = end - start
    if parent is not None:
        parent.cpu_children.append(e)
    return e


def finish(events):
    for e in events:
        e.self_cpu_time_total = e.cpu_time_total - sum(c.cpu_time_total for c in e.cpu_children)
    return events


def test_grouping_rules_with_cuda_kernels():
    page = ev(PAGE_PREFIX + "p", 0, 100)
    sam = ev(RANGE_PREFIX + "sam", 0, 40, page, kernels=[(RANGE_PREFIX + "sam", 35.0)])  # GPU side of the range
    linear = ev("aten::linear", 5, 30, sam)
    addmm = ev("aten::addmm", 10, 28, linear, kernels=[("sm90_gemm", 12.0)])
    copy = ev("aten::copy_", 31, 35, sam, kernels=[("Memcpy HtoD", 2.0)])
    dec1 = ev(RANGE_PREFIX + "decode", 50, 60, page)
    mm1 = ev("aten::mm", 51, 59, dec1, kernels=[("gemv", 3.0)])
    dec2 = ev(RANGE_PREFIX + "decode", 70, 80, page)
    mm2 = ev("aten::mm", 71, 78, dec2, kernels=[("gemv", 4.0), ("splitk_reduce", 1.0)])
    argmax = ev("aten::argmax", 62, 66, page, kernels=[("argmax_kernel", 0.5)])
    gpu_only = ev("sm90_gemm", 0, 12, device=DeviceType.CUDA)  # device events are read through their CPU op
    odd = ev("async_thing", 0, 90, is_async=True)
    ops, stages = group_events(finish([page, sam, linear, addmm, copy, dec1, mm1, dec2, mm2, argmax, gpu_only, odd]))
    get = ops.set_index(["stage", "device", "operator"])
    assert get.loc[("sam", "cpu", "aten::addmm"), "self_us"] == 18
    assert get.loc[("sam", "cpu", "aten::linear"), "self_us"] == 25 - 18
    assert get.loc[("sam", "cpu", UNTRACED), "self_us"] == 40 - 25 - 4
    assert get.loc[("decode", "cpu", "aten::mm"), "calls"] == 2
    assert get.loc[("decode", "cuda", "gemv"), "self_us"] == 7.0 and get.loc[("decode", "cuda", "gemv"), "calls"] == 2
    assert get.loc[("sam", "cuda", "sm90_gemm"), "share"] == pytest.approx(12 / 14)
    assert ("sam", "cuda", RANGE_PREFIX + "sam") not in get.index  # our own range is not a kernel
    assert get.loc[(OUTSIDE, "cuda", "argmax_kernel"), "self_us"] == 0.5
    assert get.loc[(OUTSIDE, "cpu", UNTRACED), "self_us"] == 100 - 40 - 10 - 10 - 4  # the page range's own time
    assert "async_thing" not in set(ops["operator"])
    st = stages.set_index(["stage", "device"])
    assert st.loc[("sam", "cpu"), "range_us"] == 40 == st.loc[("sam", "cpu"), "total_us"]
    assert st.loc[("decode", "cpu"), "ranges"] == 2 and st.loc[("decode", "cpu"), "total_us"] == 20
    assert st.loc[("decode", "cuda"), "total_us"] == 8.0 and pd.isna(st.loc[("decode", "cuda"), "range_us"])
    for device, group in stages.groupby("device"):
        assert group["share_of_total"].sum() == pytest.approx(1.0)


def test_empty_profile():
    ops, stages = group_events([])
    assert ops.empty and stages.empty and list(top_operators(ops).columns) == list(ops.columns)
