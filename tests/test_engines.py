"""The engine owns its kernel plan (issue 24, item 1): one validated engine description (kind + options) from
which the runtime engine is built, which every run stores, and from which the time model's kernel plan is derived
by the plan module beside the engine's code, reading its real options."""
from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.predict import Prediction, with_profile
from dsocr_core.calibration.profile import profile_from_dict, uniform_profile
from dsocr_core.cli import main
from dsocr_core.engines import ENGINES, EngineSpec, as_engine, engine_before_records, run_engine
from dsocr_core.fast.options import FastOptions
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import ModelSpec, SpecError

ROOT = Path(__file__).resolve().parents[1]
H200 = get_hardware("h200")


def _profile(kind: str = "cuda", **launch):
    d = uniform_profile(H200.peak_flops, H200.bandwidth, 0.5, 0.0, kind=kind).to_dict()
    d["launch"].update(launch)
    return profile_from_dict(d)


def _stages(engine, pts, **launch):
    return evaluate(ModelSpec(), pts, with_profile(H200, _profile(**launch), engine))


# ------------------------------------------------------------------------------------------ the description
def test_fast_options_are_the_engines_keyword_arguments():
    """FastEngine is built from FastOptions: same names, same defaults (a new engine option must be described,
    or the prediction would silently plan the default engine)."""
    from dsocr_core.fast.engine import FastEngine

    params = {n: p.default for n, p in inspect.signature(FastEngine.__init__).parameters.items()
              if n not in ("self", "model")}
    fields = {n: f.default for n, f in FastOptions.model_fields.items()}
    assert params == fields


def test_descriptions_are_validated_and_name_the_bad_option():
    spec = EngineSpec.of("fast", {"bucket": 128})
    assert spec.options["bucket"] == 128 and spec.options["graph_steps"] == 2  # every option, defaults filled
    assert spec.label() == "fast (bucket=128)" and EngineSpec.of("fast").label() == "fast"
    assert EngineSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert as_engine("reference") == EngineSpec.of("reference")
    with pytest.raises(SpecError, match="buckt"):
        EngineSpec.of("fast", {"buckt": 128})
    with pytest.raises(SpecError, match="bucket"):
        EngineSpec.of("fast", {"bucket": 0})
    with pytest.raises(SpecError, match="moe"):
        EngineSpec.of("fast", {"moe": "loop"})
    with pytest.raises(SpecError, match="takes no options"):
        EngineSpec.of("reference", {"bucket": 128})
    with pytest.raises(SpecError, match="session_mode"):
        EngineSpec.of("turbo")
    with pytest.raises(SpecError, match="unknown engine description fields"):
        EngineSpec.from_dict({"kind": "fast", "options": {}, "extra": 1})
    with pytest.raises(SpecError, match="needs a CUDA device"):
        EngineSpec.of("fast", {"fused": True}).kernel_plan("cpu")


def test_resolution_on_the_cpu_is_the_engines(tiny_model):
    """What the plan reads (options resolved on a device kind) is what the engine resolves on that device."""
    from dsocr_core.fast.engine import FastEngine

    for opts in ({}, {"bucket": 64, "graph_steps": 3, "clip_packed": False, "sam_attention": "dense"}):
        got = FastEngine(tiny_model, **opts).describe()
        r = EngineSpec.of("fast", opts).validated().resolved("cpu")
        assert (r.graphs, r.compile, r.compile_vision, r.compile_prefill, r.fused, r.attention, r.bucket,
                r.graph_steps, r.clip_packed, r.sam_attention, r.moe_rows, r.expert_fusion, r.batched_choice) == (
            got["cuda_graphs"], got["compile"], got["compile_vision"], got["compile_prefill"], got["fused_decode_b1"],
            got["attention"], got["bucket"], got["graph_steps"], got["clip_packed"], got["sam_attention"],
            got["moe_rows"], got["expert_fusion"], got["batched_choice"])


@pytest.fixture(scope="module")
def tiny_model():
    import torch

    from dsocr_core.model.checkpoint import synthetic_model
    from dsocr_core.spec import tiny_spec

    return synthetic_model(tiny_spec(), seed=0, dtype=torch.float32, device=torch.device("cpu"))


def test_the_session_builds_its_engine_from_the_description_and_runs_store_it(tmp_path):
    from dsocr_core.measure.sweep import run_sweep
    from dsocr_core.results.store import RunStore
    from dsocr_core.runtime.session import Session
    from dsocr_core.spec import Workload

    s = Session.load(synthetic="tiny", device="cpu", dtype="float32", session_mode="fast",
                     engine_options={"bucket": 64, "graph_steps": 3})
    assert s.engine.bucket == 64 and s.engine.graph_steps == 3
    assert s.describe()["engine_spec"] == EngineSpec.of("fast", {"bucket": 64, "graph_steps": 3}).to_dict()
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = run_sweep(s, store, [Workload(mode="tiny", decode_steps=2)], repeats=1, warmup=0)
    engine, recorded = run_engine(store.get_run(run_id))
    assert recorded and engine == s.engine_spec
    from dsocr_core.results.runs import engine_note, run_details

    assert "engine fast (bucket=64, graph_steps=3) (recorded with the run)" in run_details(store.get_run(run_id))
    # a run stored before engine descriptions: its session mode's engine of that time, said so
    from dsocr_core.engines import engine_before_records

    assert run_engine({"session_mode": "fast", "meta": {}}) == (engine_before_records("fast"), False)
    assert 'moe_rows="torch"' in engine_note({"session_mode": "fast", "meta": {}})
    assert "(assumed: the run predates engine descriptions" in engine_note({"session_mode": "fast", "meta": {}})
    with pytest.raises(SpecError, match="bucket"):
        Session.load(synthetic="tiny", device="cpu", session_mode="fast", engine_options={"bucket": -1})


# ------------------------------------------------------------------------------------------ the plan reads options
def test_the_prediction_needs_an_engine_description():
    with pytest.raises(SpecError, match="engine description"):
        Prediction(_profile(), "fast")
    pred = with_profile(H200, _profile(), EngineSpec.of("fast", {"bucket": 128})).prediction
    assert pred.summary()["engine"] == {"kind": "fast", "options": EngineSpec.of("fast", {"bucket": 128}).options}
    assert pred.summary()["engine_label"] == "fast (bucket=128)"


def test_bucket_and_graph_steps_reach_the_prediction():
    # batch 2 (not fused): SDPA attends over the bucket; 700-token contexts sit in different 128/1024 buckets
    pts = Points.grid(crops=[(2, 2)], text_tokens=[10], batch=[2], decode_steps=[8], logits="last")
    decode = lambda opts: _stages(EngineSpec.of("fast", opts), pts)["decode"]["predicted_kernel_s"][0]  # noqa: E731
    assert decode({"bucket": 4096, "attention": "sdpa"}) > decode({"bucket": 128, "attention": "sdpa"})
    # the split-KV kernel (the GPU's default) masks its loads past the position, so the plan prices it at the
    # position whatever the bucket (its programs past the position still start, write and combine an empty
    # partial: a few us at bucket 4,096, not modelled)
    assert decode({"bucket": 4096}) == pytest.approx(decode({"bucket": 128}))
    # batch 1 (fused): one graph replay per graph_steps steps
    one = Points.grid(crops=[(2, 2)], text_tokens=[10], batch=[1], decode_steps=[8], logits="last")
    host = {g: _stages(EngineSpec.of("fast", {"graph_steps": g}), one, graph_launch_s=1.0)["decode"]["predicted_s"]
            for g in (1, 2, 4)}
    # 1 s per replay dwarfs the kernels (a few ms over the 8 steps)
    assert [host[g][0] for g in (1, 2, 4)] == pytest.approx([8.0, 4.0, 2.0], abs=0.01)


def test_fused_clip_packing_and_sam_attention_reach_the_prediction():
    pts = Points.grid(crops=[(2, 2)], text_tokens=[10], batch=[1], decode_steps=[4], logits="last")
    launches = lambda opts: _stages(EngineSpec.of("fast", opts), pts, graph_kernel_s=1.0)  # noqa: E731
    default, unfused = launches({}), launches({"fused": False})
    assert default["decode"]["predicted_launch_s"][0] == 4 * 73  # the fused step: 73 kernels
    assert unfused["decode"]["predicted_launch_s"][0] > 4 * 73 * 2
    packed, apart = default["clip"]["predicted_launch_s"][0], launches({"clip_packed": False})["clip"][
        "predicted_launch_s"][0]
    assert apart > packed  # two view groups launch each GEMM twice
    dense = _stages(EngineSpec.of("fast", {"sam_attention": "dense"}), pts)["sam"]["predicted_s"][0]
    fold = _stages(EngineSpec.of("fast"), pts)["sam"]["predicted_s"][0]
    assert dense > fold  # the dense mask is written and read again


def test_the_plan_takes_the_engines_decode_path_at_every_batch():
    """Decode takes the fused step at batch 1, Triton's by-expert experts while batch x 8 slots <= gather_max_rows,
    the grouped GEMMs above: the plan asks the rule the engine asks (options.decode_moe)."""
    from dsocr_core.fast.options import decode_moe

    b = np.array([1, 2, 8, 64, 65, 128])
    spec = ModelSpec()
    paths = lambda opts: list(EngineSpec.of("fast", opts).kernel_plan("cuda").decode_paths(b, spec))  # noqa: E731
    assert paths({}) == ["fused", "triton", "triton", "triton", "grouped", "grouped"]
    assert paths({"gather_max_rows": 8}) == ["fused"] + ["grouped"] * 5  # the engine before 2026-11-26
    assert paths({"moe": "grouped", "fused": False}) == ["grouped"] * 6
    assert paths({"gather_max_rows": 16, "fused": False}) == ["triton", "triton"] + ["grouped"] * 4
    assert [decode_moe("auto", int(x), 8, 512, True, True) for x in b] == paths({"fused": False})
    assert list(EngineSpec.of("fast").kernel_plan("cpu").decode_paths(b, spec)) == ["gather"] * 6
    # the two paths price differently: by-expert kernels on their own table, no routing glue launches
    pts = Points.grid(crops=[(2, 2)], text_tokens=[10], batch=[8], decode_steps=[4], logits="last")
    by_expert = _stages(EngineSpec.of("fast"), pts, graph_kernel_s=1.0)["decode"]["predicted_launch_s"][0]
    grouped = _stages(EngineSpec.of("fast", {"gather_max_rows": 8}), pts, graph_kernel_s=1.0)["decode"][
        "predicted_launch_s"][0]
    moe_layers = spec.num_hidden_layers - spec.first_k_dense_replace
    # per MoE layer, besides the router GEMM both run: 2 grouped GEMMs + moe_rows' 7 (memset, counts, offsets,
    # places, copy, SwiGLU, combine) + 12 routing kernels + the gate row's 3 against 2 expert launches (the combine
    # in the down kernel's last programs) and the routing kernel that computes the logits (the router GEMM's place)
    assert grouped - by_expert == pytest.approx(4 * moe_layers * (24 - 2))
    torch_rows = _stages(EngineSpec.of("fast", {"gather_max_rows": 8, "moe_rows": "torch"}), pts,
                         graph_kernel_s=1.0)["decode"]["predicted_launch_s"][0]
    assert torch_rows - by_expert == pytest.approx(4 * moe_layers * (22 - 2))  # 17 Inductor kernels instead
    # expert_fusion 'separate' (every run before 2026-11-28): + the router GEMM's reduction, the routing kernel
    # beside the GEMM and the combine, 3 launches a MoE layer more
    separate = _stages(EngineSpec.of("fast", {"expert_fusion": "separate"}), pts, graph_kernel_s=1.0)["decode"][
        "predicted_launch_s"][0]
    assert separate - by_expert == pytest.approx(4 * moe_layers * 3)


def test_clip_mlp_sam_block_lm_attention_and_projector_kernels_get_no_overlap_credit(monkeypatch):
    """The fast plan names CLIP's MLP, SAM's block rows (norms, attention, MLP: Inductor's kernels one after
    another), the projector (its concatenation, then the GEMM) and the LM's attention as rows of separate kernels:
    their kernels' own rooflines add up instead of the row's max(compute, memory); the other rows keep the
    overlap."""
    from dsocr_core.fast.plan import FastPlan

    pts = Points.grid(crops=[(2, 2)], text_tokens=[10], batch=[1, 8], decode_steps=[0], logits="last")
    separate = _stages(EngineSpec.of("fast"), pts)
    monkeypatch.setattr(FastPlan, "separate_rows", frozenset())
    monkeypatch.setattr(FastPlan, "sam_rows", frozenset())
    credited = _stages(EngineSpec.of("fast"), pts)
    for stage in ("clip", "sam", "prefill"):
        assert np.all(separate[stage]["predicted_roofline_s"] > credited[stage]["predicted_roofline_s"]), stage
    # the projector's concatenation and GEMM too (the GEMM reads what the copy wrote): where the GEMM's compute
    # bounds the row (batch 8) the copy's roofline is no longer hidden under it
    assert np.all(separate["projector"]["predicted_s"] >= credited["projector"]["predicted_s"])
    assert separate["projector"]["predicted_s"][-1] > credited["projector"]["predicted_s"][-1]
    # in the prefill only the attention row changes: the MLP, norm and embedding rows keep their credit
    from dsocr_core.analytic.api import module_table
    from dsocr_core.spec import Workload

    monkeypatch.undo()
    page = Workload(mode="gundam", crops=(2, 2), batch=8, text_tokens=10, decode_steps=0, logits="last")
    hw = with_profile(H200, _profile(), EngineSpec.of("fast"))
    rows = lambda: module_table(ModelSpec(), page, hw).set_index(["stage", "module"])["predicted_s"]  # noqa: E731
    with_sep = rows()
    monkeypatch.setattr(FastPlan, "separate_rows", FastPlan.separate_rows - {"lm.self_attn"})
    without = rows()
    changed = {m for (st, m) in with_sep.index if st == "prefill" and with_sep[(st, m)] != without[(st, m)]}
    assert changed and all(".self_attn" in m for m in changed), changed


def test_options_the_plan_does_not_model_are_noted():
    hw = with_profile(H200, _profile(), EngineSpec.of("fast", {"moe": "gather", "compile": False}))
    evaluate(ModelSpec(), Points.grid(crops=[(1, 1)], decode_steps=[2]), hw)
    notes = " ".join(hw.prediction.summary()["notes"])
    assert "moe='gather'" in notes and "torch.compile off" in notes
    assert not with_profile(H200, _profile(), "fast").prediction.engine.kernel_plan("cuda").notes


def test_registry_modules_sit_beside_the_engines_and_import_no_torch():
    for kind in ENGINES.values():
        engine_pkg = kind.engine.split(":")[0].rsplit(".", 1)[0]
        assert kind.plan.startswith(engine_pkg + ".")  # the plan lives in the engine's own package
    code = ("import sys; from dsocr_core.engines import ENGINES, EngineSpec; "
            "[EngineSpec.of(k).kernel_plan(d) for k in ENGINES for d in ('cuda', 'cpu')]; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_cli_engine_options(tmp_path, capsys):
    prof = _profile().save(tmp_path / "p.json")
    assert main(["analytic", "--crops", "2x2", "--decode-steps", "8", "--profile", str(prof), "--session-mode",
                 "fast", "--engine-options", '{"bucket": 128}']) == 0
    assert "predicted (fast (bucket=128) mode" in capsys.readouterr().out
    assert main(["analytic", "--crops", "2x2", "--profile", str(prof), "--session-mode", "fast",
                 "--engine-options", '{"bukket": 1}']) == 2
    assert "bukket" in capsys.readouterr().err
    assert main(["analytic", "--crops", "2x2", "--profile", str(prof), "--engine-options", "{bad"]) == 2
    assert "--engine-options: not JSON" in capsys.readouterr().err


def test_the_same_points_predict_the_same_in_a_sweep(tmp_path):
    """The plan objects are built once per prediction: a sweep and single points agree (non-default options)."""
    eng = EngineSpec.of("fast", {"bucket": 64, "graph_steps": 3})
    pts = Points.grid(crops=[(1, 1), (2, 2)], text_tokens=[10, 300], batch=[1, 4], decode_steps=[5], logits="last")
    many = _stages(eng, pts)
    for i in range(pts.size):
        one = _stages(eng, pts.take(np.array([i])))
        assert one["decode"]["predicted_s"][0] == pytest.approx(many["decode"]["predicted_s"][i], rel=1e-12)


def test_the_by_expert_kernels_stop_at_their_token_tile():
    """Batches above BY_EXPERT_MAX_TOKENS run the grouped GEMMs under 'auto' whatever gather_max_rows says, and an
    explicit moe='triton' there is refused with the reason (its per-expert token tile), by the engine's rule and
    so by the plan."""
    from dsocr_core.fast.options import BY_EXPERT_MAX_TOKENS, decode_moe

    assert decode_moe("auto", BY_EXPERT_MAX_TOKENS, 8, 10**6, True, True) == "triton"
    assert decode_moe("auto", BY_EXPERT_MAX_TOKENS + 1, 8, 10**6, True, True) == "grouped"
    assert decode_moe("triton", BY_EXPERT_MAX_TOKENS, 8, 0, True, True) == "triton"
    with pytest.raises(SpecError, match="up to 64 rows"):
        decode_moe("triton", BY_EXPERT_MAX_TOKENS + 1, 8, 512, True, True)
    plan = EngineSpec.of("fast", {"moe": "triton"}).kernel_plan("cuda")
    with pytest.raises(SpecError, match="moe='triton'"):
        plan.decode_paths(np.array([1, 96]), ModelSpec())


def test_results_without_an_engine_record_are_predicted_on_the_engine_of_their_time():
    from dsocr_core.engines import engine_before_records

    old = engine_before_records("fast")
    assert old.options["gather_max_rows"] == 8
    assert old.options["projector_layout"] == "per_image" and old.options["moe_rows"] == "torch"
    assert old.options["expert_fusion"] == "separate"
    assert list(old.kernel_plan("cuda").decode_paths(np.array([1, 8]), ModelSpec())) == ["fused", "grouped"]
    assert engine_before_records("reference") == EngineSpec.of("reference")


def test_the_engine_and_its_plan_choose_the_same_decode_experts(tiny_model):
    """FastEngine.moe_impl and FastPlan.decode_paths ask one rule: on this CPU, for every option set, the engine's
    choice per batch is the plan's path (batch 1 aside, where the plan names the fused step when it is on)."""
    from dsocr_core.fast.engine import FastEngine
    from dsocr_core.spec import tiny_spec

    batches = np.array([1, 2, 7, 33, 64])
    for opts in ({}, {"moe": "grouped"}, {"moe": "gather"}, {"gather_max_rows": 8}):
        engine = FastEngine(tiny_model, **opts)
        plan = EngineSpec.of("fast", opts).kernel_plan("cpu")
        assert [engine.moe_impl(int(b)) for b in batches] == list(plan.decode_paths(batches, tiny_spec())), opts


def test_a_stored_description_from_before_an_option_gets_the_value_it_ran_with():
    """A stored description holds every option of its time: one written before projector_layout existed ran the
    per-image layout, and is read back so (not as today's default); a partial description gets the defaults."""
    stored = EngineSpec.of("fast", {"gather_max_rows": 8}).to_dict()
    del stored["options"]["projector_layout"]
    assert EngineSpec.from_dict(stored).options["projector_layout"] == "per_image"
    assert EngineSpec.from_dict({"kind": "fast", "options": {"bucket": 64}}).options["projector_layout"] == "gather"
    assert EngineSpec.of("fast").options["projector_layout"] == "gather"
    fresh = EngineSpec.of("fast").to_dict()
    assert EngineSpec.from_dict(fresh) == EngineSpec.of("fast")
    # the rule reads the option set of that time, not today's: a later option does not switch it off
    from dsocr_core.fast.options import OPTIONS_BEFORE_PROJECTOR_LAYOUT, FastOptions

    old = {k: v for k, v in stored["options"].items() if k in OPTIONS_BEFORE_PROJECTOR_LAYOUT}
    assert set(old) == OPTIONS_BEFORE_PROJECTOR_LAYOUT  # every option of that time is still an option
    assert FastOptions.from_stored(old)["projector_layout"] == "per_image"
    assert "projector_layout" not in FastOptions.from_stored({k: old[k] for k in list(old)[1:]})
    # moe_rows: every description stored before it ran Inductor's rows ('torch'), with either layout
    assert FastOptions.from_stored(old)["moe_rows"] == "torch"
    with_layout = {**old, "projector_layout": "gather"}
    assert FastOptions.from_stored(with_layout) == {**with_layout, "moe_rows": "torch", "expert_fusion": "separate",
                                                    "batched_choice": "host"}
    assert EngineSpec.from_dict(stored).options["moe_rows"] == "auto"  # written with it (only the layout removed)
    del stored["options"]["moe_rows"]
    assert EngineSpec.from_dict(stored).options["moe_rows"] == "torch"
    assert EngineSpec.from_dict(fresh).options["moe_rows"] == "auto"  # written with it: kept
    # expert_fusion: every description stored before it ran the router GEMM and the combine separately
    assert FastOptions.from_stored(old)["expert_fusion"] == "separate"
    assert EngineSpec.from_dict(stored).options["expert_fusion"] == "auto"  # written with it
    del stored["options"]["expert_fusion"]
    assert EngineSpec.from_dict(stored).options["expert_fusion"] == "separate"
    assert EngineSpec.from_dict(fresh).options["expert_fusion"] == "auto"
    assert EngineSpec.of("fast").validated().resolved("cuda").expert_fusion == "fused"
    assert EngineSpec.of("fast").validated().resolved("cpu").expert_fusion == "separate"
    with pytest.raises(SpecError, match="expert_fusion"):
        EngineSpec.of("fast", {"expert_fusion": "fused"}).kernel_plan("cpu")
    # batched_choice: every description stored before it chose on the host; today's default is the graph on a GPU
    assert FastOptions.from_stored(old)["batched_choice"] == "host"
    assert EngineSpec.from_dict(stored).validated().resolved("cuda").batched_choice == "graph"  # written with it
    del stored["options"]["batched_choice"]
    assert EngineSpec.from_dict(stored).validated().resolved("cuda").batched_choice == "host"
    assert EngineSpec.from_dict(fresh).validated().resolved("cuda").batched_choice == "graph"
    assert EngineSpec.of("fast").validated().resolved("cuda").batched_choice == "graph"
    assert EngineSpec.of("fast").validated().resolved("cpu").batched_choice == "host"
    assert engine_before_records("fast").validated().resolved("cuda").batched_choice == "host"
    with pytest.raises(SpecError, match="batched_choice"):
        EngineSpec.of("fast", {"batched_choice": "graph"}).kernel_plan("cpu")


def test_the_batched_choice_in_the_graph_reaches_the_plan():
    """batched_choice='graph': a batched step's choice is three kernels in its graph (best_rows reading every logit
    and its stamp) and one eager copy instead of the host's seven ops; the fused batch-1 step is not affected."""
    pts = Points.grid(crops=[(2, 2)], text_tokens=[10], batch=[1, 8], decode_steps=[4], logits="last")
    host = _stages(EngineSpec.of("fast", {"batched_choice": "host"}), pts, graph_kernel_s=1.0)["decode"]
    graph = _stages(EngineSpec.of("fast"), pts, graph_kernel_s=1.0)["decode"]  # the default on a GPU
    assert graph["predicted_launch_s"][0] == host["predicted_launch_s"][0]  # batch 1: the fused step
    assert graph["predicted_launch_s"][1] == pytest.approx(host["predicted_launch_s"][1] + 4 * (3 - 7))
    # a host that issues an op in a second (far slower than the device): the step's host time is its eager ops
    slow = {"graph_kernel_s": 0.0, "host_op_s": 1.0}
    host_ops = _stages(EngineSpec.of("fast", {"batched_choice": "host"}), pts, **slow)["decode"]["predicted_host_s"][1]
    graph_ops = _stages(EngineSpec.of("fast"), pts, **slow)["decode"]["predicted_host_s"][1]
    assert graph_ops < host_ops and host_ops - graph_ops == pytest.approx(4 * (7 - 1), rel=0.01)


def test_the_projector_layout_reaches_the_plan():
    """The gathered layout is one kernel per call whatever the batch; the per-image loop is 2 per image plus 2 per
    tiled image, and one more concatenation before the LM's embedding. A profile without memory.gather_rows
    prices the gather on memory.elementwise and says so."""
    pts = Points.grid(crops=[(2, 2)], text_tokens=[10], batch=[1, 8], decode_steps=[1], logits="last")
    gather = _stages(EngineSpec.of("fast"), pts, graph_kernel_s=1.0)
    loop = _stages(EngineSpec.of("fast", {"projector_layout": "per_image"}), pts, graph_kernel_s=1.0)
    # projector rows: per view group (global views, tiles) the transposed cat and the GEMM, then the layout
    assert list(gather["projector"]["predicted_launch_s"]) == pytest.approx([2 * 2 + 1, 2 * 2 + 1])
    assert list(loop["projector"]["predicted_launch_s"]) == pytest.approx([2 * 2 + 4, 2 * 2 + 4 * 8])
    assert loop["prefill"]["predicted_launch_s"][0] == pytest.approx(gather["prefill"]["predicted_launch_s"][0] + 1)
    older = _profile().to_dict()
    del older["tables"]["memory.gather_rows"]  # a profile measured before the table existed
    hw = with_profile(H200, profile_from_dict(older), EngineSpec.of("fast"))
    fallback = evaluate(ModelSpec(), pts, hw)
    assert any("memory.gather_rows" in n and "memory.elementwise" in n for n in hw.prediction.notes)
    assert np.all(fallback["projector"]["predicted_s"] > 0)
