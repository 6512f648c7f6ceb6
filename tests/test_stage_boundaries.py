"""benchmarks/stage_boundaries.py: the fast engine's prefill timed with the stage timer as it is and with a timer
that only records events at the stage boundaries, alternating. On the CPU (tiny model) every stage is timed both
ways; the unsynced timer is checked, on a stand-in CUDA device, to queue no synchronisation, peak reset or wait
where the timer as it is queues all three."""
import json

import pytest
import torch

from benchmark_scripts import load_benchmark


def _script():
    return load_benchmark("stage_boundaries")


def test_every_stage_is_timed_both_ways(tmp_path):
    sb = _script()
    out = tmp_path / "sb.json"
    assert sb.main(["--device", "cpu", "--quick", "--points", "gundam:2x1,small:1x1:b2:t40", "--repeats", "2",
                    "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "stage_boundaries" and result["repeats"] == 2
    assert [(p["mode"], p["batch"], p["text_tokens"]) for p in result["points"]] == [("gundam", 1, 10),
                                                                                     ("small", 2, 40)]
    for p in result["points"]:
        for mode in sb.MODES:
            stages = p[mode]
            assert set(stages) == {"sam", "clip", "projector", "prefill", "span"}
            for s in stages.values():
                assert 0 < s["min_s"] <= s["median_s"] <= s["max_s"]
            # the span runs from the first stage's start to the last one's end: it holds every stage
            assert stages["span"]["min_s"] >= 0.99 * min(stages[k]["min_s"] for k in ("sam", "prefill"))


def test_the_unsynced_timer_queues_no_synchronisation(monkeypatch):
    sb = _script()
    calls = []

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            calls.append("event")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda *a, **k: calls.append("wait"))
    monkeypatch.setattr(torch.cuda, "device", lambda *a, **k: __import__("contextlib").nullcontext())
    cuda = torch.device("cuda")
    with sb.UnsyncedTimer(cuda).stage("projector", track_memory=True):
        pass
    assert calls == ["event", "event"]
    calls.clear()
    with sb.timer_of("synced", cuda).stage("projector", track_memory=True):
        pass
    assert {"sync", "reset", "wait"} <= set(calls) and calls.count("event") == 2


def test_bad_arguments_are_refused():
    sb = _script()
    with pytest.raises(SystemExit):
        sb.main(["--device", "cpu", "--quick", "--repeats", "0", "--out", "/tmp/never.json"])
    with pytest.raises(SystemExit):
        sb.main(["--device", "cpu", "--quick", "--points", "gundam:3by2", "--out", "/tmp/never.json"])
