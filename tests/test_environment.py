import json
import re

import pytest

from dsocr_core.measure import environment
from dsocr_core.measure.environment import FIELDS, GPU_FIELDS, capture_environment, parse_nvidia_smi_csv


def test_cpu_environment_has_every_key_and_no_gpu_facts():
    env = capture_environment("cpu")
    assert set(env) == set(FIELDS)
    assert env["device"] == "cpu"
    for field in GPU_FIELDS:
        assert env[field] is None, field
        assert "cpu" in env["missing"][field]  # says why, not just None
    for field in ("python", "platform", "hostname", "numpy", "pydantic", "torch", "dsocr_core"):
        assert env[field], field
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$", env["captured_at"])
    assert isinstance(env["gpu_count"], int)
    json.dumps(env)  # storable as is


def test_cuda_requested_without_cuda_records_why():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = capture_environment("cuda:0")
    assert env["gpu_name"] is None and env["cuda_available"] is False
    assert "is_available" in env["missing"]["gpu_name"]


def test_never_raises_when_probes_fail(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(environment.socket, "gethostname", boom)
    monkeypatch.setattr(environment, "_cpu_model", boom)
    monkeypatch.setattr(environment, "_torch_facts", boom)
    env = capture_environment("cuda")
    assert env["hostname"] is None and "probe exploded" in env["missing"]["hostname"]
    assert env["cpu_model"] is None and set(env) == set(FIELDS)


def test_parse_nvidia_smi_csv():
    text = (
        "GPU-1111, NVIDIA H200, 570.86.15, 1980, 3201, 1980, 3201, 700.00, P0, 0\n"
        "GPU-2222, NVIDIA H200, 570.86.15, [N/A], [N/A], 1980, 3201, [Not Supported], P8, 1\n"
        "garbage line\n"
    )
    rows = parse_nvidia_smi_csv(text)
    assert len(rows) == 2
    assert rows[0] == {"gpu_uuid": "GPU-1111", "gpu_name": "NVIDIA H200", "driver": "570.86.15",
                       "sm_clock_mhz": 1980.0, "mem_clock_mhz": 3201.0, "sm_clock_max_mhz": 1980.0,
                       "mem_clock_max_mhz": 3201.0, "power_limit_w": 700.0, "pstate": "P0", "smi_index": "0"}
    assert rows[1]["sm_clock_mhz"] is None and rows[1]["power_limit_w"] is None


def test_pick_gpu_by_uuid_index_and_visible_devices(monkeypatch):
    rows = parse_nvidia_smi_csv(
        "GPU-aaaa, A, 1, 1, 1, 1, 1, 1, P0, 0\n"
        "GPU-bbbb, B, 1, 1, 1, 1, 1, 1, P0, 1\n"
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert environment._pick_gpu(rows, {"gpu_uuid": "GPU-bbbb", "gpu_index": 0})["gpu_name"] == "B"
    assert environment._pick_gpu(rows, {"gpu_uuid": None, "gpu_index": 1})["gpu_name"] == "B"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert environment._pick_gpu(rows, {"gpu_uuid": None, "gpu_index": 0})["gpu_name"] == "B"
