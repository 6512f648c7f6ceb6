"""MoE routing: the Routing table and its file format, the record of a measured point's routing, and a measured
run predicted with the routing it observed."""
import json
from pathlib import Path

import numpy as np
import torch
import pytest

from dsocr_core.analytic.lm import expected_experts
from dsocr_core.analytic.predict import UNIFORM_ROUTING, profile_hardware, with_profile
from dsocr_core.analytic.routing import (Routing, RoutingError, calls_of_record, load_routing, routing_from_calls,
                                         routing_table)
from dsocr_core.calibration.profile import load_profile
from dsocr_core.measure.sweep import run_sweep, sweep_workloads
from dsocr_core.results.analytic_join import compare_run, observed_routing, run_prediction
from dsocr_core.results.prediction_check import predicted_stages
from dsocr_core.results.store import RunStore
from dsocr_core.spec import ModelSpec, SpecError, Workload

PROFILE = Path(__file__).resolve().parents[1] / "data" / "profiles" / "h100.json"
E, K = 64, 6  # the full model's routed experts and top-k


def half_uniform(tokens=(8.0, 512.0)) -> Routing:
    """A routing that reaches half the experts uniform routing would, at two token counts."""
    t = np.asarray(tokens)
    return Routing(E, K, tuple(tokens), tuple(np.maximum(0.5 * expected_experts(E, K, t), K)), (3, 3), "test")


def test_touched_interpolates_the_observed_ratio_and_stays_possible():
    r = half_uniform()
    t = np.array([1.0, 4.0, 8.0, 64.0, 512.0, 4096.0])
    got = r.touched(E, K, t)
    uniform = expected_experts(E, K, t)
    assert got[0] == pytest.approx(K)  # one token always reaches its k experts
    assert got[2] == pytest.approx(0.5 * uniform[2]) and got[3] == pytest.approx(0.5 * uniform[3])
    assert got[4] == pytest.approx(0.5 * uniform[4])
    # outside the observed 8-512 tokens per call the routing says nothing: uniform
    assert got[1] == pytest.approx(uniform[1]) and got[5] == pytest.approx(uniform[5])
    assert (got >= K).all() and (got <= E).all()
    assert r.touched(E, K, 64.0) == pytest.approx(0.5 * expected_experts(E, K, 64.0))  # scalars too


def test_a_routing_for_another_model_is_refused():
    with pytest.raises(SpecError, match="k=6 of E=64"):
        half_uniform().touched(8, 2, np.array([4.0]))


def test_impossible_tables_are_refused():
    with pytest.raises(RoutingError, match="impossible"):
        Routing(E, K, (8.0,), (60.0,), (1,), "x")  # 8 tokens x 6 experts reach at most 48
    with pytest.raises(RoutingError, match="increasing"):
        Routing(E, K, (8.0, 8.0), (10.0, 10.0), (1, 1), "x")


def test_routing_profile_round_trip_and_bad_files(tmp_path):
    r = half_uniform()
    back = load_routing(r.save(tmp_path / "r.json"))
    assert back.tokens == r.tokens and back.observed == pytest.approx(r.observed) and back.source == "test"
    data = json.loads((tmp_path / "r.json").read_text())
    for field, value, msg in (("format", "other", "format must be"), ("k", 0, "k must be"),
                              ("calls", [], "calls must be"), ("extra", 1, "unknown fields")):
        (tmp_path / "bad.json").write_text(json.dumps({**data, field: value}))
        with pytest.raises(RoutingError, match=msg) as exc:
            load_routing(tmp_path / "bad.json")
        assert "bad.json" in str(exc.value)
    data["calls"][0]["distinct"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(RoutingError, match=r"calls\[0\]\.distinct"):
        load_routing(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(RoutingError, match="not a JSON routing profile"):
        load_routing(tmp_path / "bad.json")
    with pytest.raises(RoutingError, match="no such file"):
        load_routing(tmp_path / "missing.json")


def test_records_become_one_routing_averaged_per_token_count():
    prefill = {"tokens": 40, "distinct": [7, 8]}
    decode = {"tokens": 2, "distinct": [[3, 4], [2, 3]]}
    calls = calls_of_record(prefill) + calls_of_record(decode)
    r = routing_from_calls(calls, 8, 2, "run x")
    assert r.tokens == (2.0, 40.0) and r.observed == pytest.approx((3.0, 7.5)) and r.samples == (4, 2)
    assert routing_from_calls([], 8, 2, "run x") is None
    table = routing_table(r)
    assert list(table["layer-calls"]) == [4, 2]
    assert table["observed / uniform"].iloc[0] == pytest.approx(3.0 / expected_experts(8, 2, 2.0))


def test_observed_routing_lowers_the_predicted_moe_time():
    """Fewer distinct experts read fewer expert weights: a batch's decode step is predicted faster."""
    prof = load_profile(PROFILE)
    w = Workload(mode="base", batch=8, text_tokens=200, decode_steps=32)
    uniform = with_profile(profile_hardware(prof), prof, "fast")
    observed = with_profile(profile_hardware(prof), prof, "fast", routing=half_uniform())
    assert uniform.prediction.routing_label() == UNIFORM_ROUTING
    assert observed.prediction.routing_label().startswith("observed (test; 8-512 tokens per call")
    (u,), (o,) = predicted_stages(ModelSpec(), [w], uniform), predicted_stages(ModelSpec(), [w], observed)
    assert o["tpot"] < 0.95 * u["tpot"] and o["sam"] == pytest.approx(u["sam"])


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory):
    from dsocr_core.runtime.session import Session

    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    store = RunStore(tmp_path_factory.mktemp("routing") / "runs.sqlite")
    workloads = sweep_workloads(["tiny"], [(2, 1)], [20], [2], [3], dtype="float32")
    return store, run_sweep(session, store, workloads, repeats=1)


def test_a_measured_point_records_the_experts_each_layer_touched(measured_run):
    store, run_id = measured_run
    pts = store.points(run_id)
    extra = {r.stage: r.stage_extra for r in pts.itertuples()}
    spec = ModelSpec(**store.get_run(run_id)["meta"]["spec"])
    layers = len(spec.moe_layers)
    prefill, decode = extra["prefill"]["routing"], extra["decode_step"]["routing"]
    assert len(prefill["distinct"]) == layers and prefill["tokens"] > 2
    assert decode["tokens"] == 2 and len(decode["distinct"]) == 2  # batch 2, two counted decode steps
    for d in [*prefill["distinct"], *sum(decode["distinct"], [])]:
        assert spec.num_experts_per_tok <= d <= spec.n_routed_experts
    # each layer-call's loads: the rows of each touched expert, largest first, k rows per token in all
    for loads, d in zip(prefill["loads"], prefill["distinct"]):
        assert len(loads) == d and loads == sorted(loads, reverse=True)
        assert sum(loads) == prefill["tokens"] * spec.num_experts_per_tok
    assert [len(step) for step in decode["loads"]] == [layers, layers]
    routing = observed_routing(store.get_run(run_id), pts)
    assert routing.shapes is not None and all(sh is not None for sh in routing.shapes)
    rows = routing.rows_by_rank(spec.n_routed_experts, spec.num_experts_per_tok, prefill["tokens"])
    assert rows.sum() == pytest.approx(prefill["tokens"] * spec.num_experts_per_tok)


def test_loads_become_a_mean_shape_per_token_count_and_survive_the_file(tmp_path):
    calls = calls_of_record({"tokens": 50, "distinct": [3, 2], "loads": [[60, 30, 10], [80, 20]]})
    calls += calls_of_record({"tokens": 2, "distinct": [[2]], "loads": [[[3, 1]]]})
    r = routing_from_calls(calls, 8, 2, "run x")
    assert r.shapes[1] == pytest.approx((0.7, 0.25, 0.05, 0, 0, 0, 0, 0))  # (0.6 + 0.8) / 2, ...
    rows = r.rows_by_rank(8, 2, np.array([50.0, 20.0, 400.0]))
    assert rows[0, :3] == pytest.approx([70.0, 25.0, 5.0])
    assert rows[1, 0] == pytest.approx(0.7 * 40) and np.isnan(rows[2]).all()  # nearest (log): 50 tokens; 400 outside
    table = routing_table(r)
    assert table["largest expert's share of the rows"].tolist() == pytest.approx([0.75, 0.7])
    table = routing_table(r)
    assert table["largest expert's share of the rows"].tolist() == pytest.approx([0.75, 0.7])
    back = load_routing(r.save(tmp_path / "r.json"))
    assert back.shapes[1] == pytest.approx(r.shapes[1])
    old = routing_from_calls(calls_of_record({"tokens": 50, "distinct": [3, 2]}), 8, 2, "run y")
    assert old.shapes is None and old.rows_by_rank(8, 2, 50.0) is None  # records made before loads
    data = json.loads((tmp_path / "r.json").read_text())
    data["calls"][0]["loads"] = [0.5, 0.6] + [0.0] * 6
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(RoutingError, match="summing to 1"):
        load_routing(tmp_path / "bad.json")


def test_a_measured_run_is_predicted_with_its_observed_routing(measured_run):
    store, run_id = measured_run
    run, pts = store.get_run(run_id), store.points(run_id)
    routing = observed_routing(run, pts)
    assert routing is not None and routing.source.startswith(f"run {run_id[:8]}")
    prof = load_profile(PROFILE)
    hw = run_prediction(run, pts, with_profile(profile_hardware(prof), prof, "fast"))
    assert hw.prediction.routing is routing or hw.prediction.routing.tokens == routing.tokens
    assert hw.prediction.engine.kind == run["session_mode"]
    df = compare_run(store, run_id, prediction=with_profile(profile_hardware(prof), prof, "fast"))
    assert set(df["predicted_routing"]) == {routing.label()}
    no_routing = pts.assign(stage_extra=[None] * len(pts))
    assert observed_routing(run, no_routing) is None
    hw = run_prediction(run, no_routing, with_profile(profile_hardware(prof), prof, "fast"))
    assert hw.prediction.routing_label() == UNIFORM_ROUTING


def test_cli_saves_a_runs_routing_and_predicts_what_ifs_with_it(measured_run, tmp_path, capsys):
    from dsocr_core.cli import main

    store, run_id = measured_run
    out = tmp_path / "routing.json"
    assert main(["runs", run_id[:12], "--store", str(store.path), "--save-routing", str(out)]) == 0
    assert "saved the routing" in capsys.readouterr().out
    assert load_routing(out).source.startswith(f"run {run_id[:8]}")
    args = ["analytic", "--spec", "tiny", "--mode", "base", "--batch", "8", "--decode-steps", "4", "--logits",
            "last", "--profile", str(PROFILE), "--session-mode", "fast", "--json"]
    assert main(args) == 0
    uniform = json.loads(capsys.readouterr().out)
    assert main(args + ["--routing", str(out)]) == 0
    observed = json.loads(capsys.readouterr().out)
    assert uniform["prediction"]["routing"] == UNIFORM_ROUTING
    assert observed["prediction"]["routing"] == load_routing(out).label()


def test_cli_refuses_routing_it_cannot_use(measured_run, tmp_path, capsys):
    from dsocr_core.cli import main

    store, run_id = measured_run
    assert main(["analytic", "--routing", str(tmp_path / "none.json")]) == 2
    assert "--routing needs --profile" in capsys.readouterr().err
    assert main(["analytic", "--profile", str(PROFILE), "--routing", str(tmp_path / "none.json")]) == 2
    assert "none.json: no such file" in capsys.readouterr().err
    full = half_uniform().save(tmp_path / "full.json")  # k=6 of E=64: not the tiny model's experts
    assert main(["analytic", "--spec", "tiny", "--batch", "4", "--decode-steps", "2", "--profile", str(PROFILE),
                 "--routing", str(full)]) == 2
    assert "k=6 of E=64" in capsys.readouterr().err
    bare = RunStore(tmp_path / "bare.sqlite")
    rid = bare.import_run(PROFILE.parents[1] / "reference" / "h200_fast.json")  # measured before routing records
    assert main(["runs", rid[:12], "--store", str(bare.path), "--save-routing", str(tmp_path / "r.json")]) == 2
    assert "recorded no MoE routing" in capsys.readouterr().err and not (tmp_path / "r.json").exists()


def test_a_dataset_page_whose_flops_are_reused_records_no_routing_of_another_page():
    """FLOPs follow the shape, routing follows the content: a page that reuses an earlier page's FLOP count
    (--flops shape) stores no routing rather than the other page's."""
    from dsocr_core.measure.dataset_run import FlopCache
    from dsocr_core.runtime.inputs import synthetic_inputs
    from dsocr_core.runtime.session import Session

    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    cache = FlopCache(session, "shape")
    first, how = cache.counted(synthetic_inputs("tiny", (1, 1), 12, 1, seed=1, dtype=torch.float32), "last")
    assert how == "counted" and first["routing"]["prefill"]["distinct"]
    again, how = cache.counted(synthetic_inputs("tiny", (1, 1), 12, 1, seed=2, dtype=torch.float32), "last")
    assert how == "same shape" and again["routing"] is None and again["prefill"] == first["prefill"]
    assert first["routing"] is not None  # the cached count keeps the first page's own record


def test_the_routing_travels_with_an_exported_run(measured_run, tmp_path):
    """A run measured on a GPU machine and imported into the dashboard's store keeps its routing records."""
    store, run_id = measured_run
    path = store.export_run(run_id, tmp_path / "run.json")
    other = RunStore(tmp_path / "other.sqlite")
    rid = other.import_run(path)
    here = observed_routing(store.get_run(run_id), store.points(run_id))
    there = observed_routing(other.get_run(rid), other.points(rid))
    assert there.tokens == here.tokens and there.observed == pytest.approx(here.observed)
