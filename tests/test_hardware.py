"""GPU presets, device-name matching and calibration (CPU code path here; the CUDA path is marked gpu)."""
import pytest
import torch

from dsocr_core.hardware import (PRESETS, CalibrationError, calibrate, get_hardware, match_device_name,
                                 measure_copy_bandwidth, measure_matmul_flops)
from dsocr_core.spec import SpecError

FACTS = {  # vendor datasheets: dense (not sparse) BF16 TFLOP/s, GB, TB/s
    "h200": (989, 141, 4.8), "h100-sxm": (989, 80, 3.35), "h100-pcie": (756, 80, 2.0), "h20": (148, 96, 4.0),
    "a100-sxm-80gb": (312, 80, 2.039), "a100-sxm-40gb": (312, 40, 1.555), "l40s": (362, 48, 0.864),
    "rtx4090": (165, 24, 1.008), "rtx5090": (209.5, 32, 1.792), "b200": (2250, 180, 8.0),
}


def test_presets_carry_datasheet_figures_and_sources():
    assert set(PRESETS) == set(FACTS)
    for key, (tflops, mem, tbs) in FACTS.items():
        hw = PRESETS[key]
        assert (hw.peak_tflops, hw.memory_gb, hw.bandwidth_tbs) == (tflops, mem, tbs), key
        assert not hw.calibrated and "NVIDIA" in hw.source
        assert "https://" in hw.source or key == "h20", key  # NVIDIA posts no public H20 datasheet
        assert "dense" in hw.source  # never the sparse figure


@pytest.mark.parametrize("device_name,key", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 SXM5 80GB", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H20", "h20"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA GeForce RTX 5090", "rtx5090"),
    ("NVIDIA B200", "b200"),
])
def test_device_names_match(device_name, key):
    assert match_device_name(device_name) is PRESETS[key]
    assert get_hardware(device_name) is PRESETS[key]


@pytest.mark.parametrize("device_name", [
    "NVIDIA H200 NVL", "NVIDIA H100 NVL", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB",
    "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA L40", "Tesla T4",
    "NVIDIA GeForce RTX 3090", "NVIDIA H100",
])
def test_look_alike_products_do_not_match(device_name):
    assert match_device_name(device_name) is None


@pytest.mark.parametrize("name,key", [("h200", "h200"), ("H100-SXM", "h100-sxm"), ("h100 pcie", "h100-pcie"),
                                      ("RTX4090", "rtx4090"), ("rtx-5090", "rtx5090"), ("A100_SXM_40GB", "a100-sxm-40gb")])
def test_preset_keys_ignore_case_and_separators(name, key):
    assert get_hardware(name) is PRESETS[key]


def test_unknown_hardware_names_presets():
    with pytest.raises(SpecError, match="unknown hardware 'Voodoo 3'.*h200"):
        get_hardware("Voodoo 3")
    with pytest.raises(SpecError):
        get_hardware("")


def test_ridge_point():
    assert PRESETS["h200"].ridge_intensity == pytest.approx(989e12 / 4.8e12)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_calibration_without_cuda_is_a_clear_error():
    for fn in (calibrate, measure_matmul_flops, measure_copy_bandwidth):
        with pytest.raises(CalibrationError, match="needs a CUDA GPU"):
            fn()
    with pytest.raises(CalibrationError, match="unsupported"):
        calibrate(device="tpu")


def test_calibration_cpu_code_path():
    hw = calibrate(device="cpu", matmul_size=64, copy_bytes=1 << 20, warmup=1, repeats=3)
    assert hw.calibrated and hw.peak_tflops > 0 and hw.bandwidth_tbs > 0 and hw.memory_gb > 0
    assert hw.source.startswith("calibrated on CPU") and "64^3" in hw.source
    with pytest.raises(CalibrationError):
        measure_matmul_flops(0, device="cpu")


@pytest.mark.gpu
def test_calibration_on_gpu():
    hw = calibrate(matmul_size=4096, copy_bytes=1 << 28, warmup=2, repeats=5)
    assert hw.calibrated and hw.name == torch.cuda.get_device_name()
    preset = match_device_name(hw.name)
    if preset is not None:  # achievable is below datasheet, but not absurdly so
        assert 0.2 * preset.peak_tflops < hw.peak_tflops < 1.1 * preset.peak_tflops
        assert 0.3 * preset.bandwidth_tbs < hw.bandwidth_tbs < 1.1 * preset.bandwidth_tbs


def test_cpu_calibration_measures_in_the_runs_dtype_with_their_threads():
    hw = calibrate(device="cpu", matmul_size=128, copy_bytes=1 << 20, warmup=1, repeats=3, dtype="float32")
    assert hw.name == f"CPU (float32, {torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''})"
    assert "float32 128^3 matmul" in hw.source and "torch thread(s)" in hw.source
    with pytest.raises(CalibrationError, match="unsupported calibration dtype 'int8'"):
        calibrate(device="cpu", matmul_size=64, copy_bytes=1 << 20, dtype="int8")


def test_cpu_matmul_size_follows_the_speed():
    from dsocr_core.hardware import cpu_matmul_size

    assert cpu_matmul_size("float32", target_s=0.0) == 256  # the first call already takes the target
    assert cpu_matmul_size("float32", target_s=1e9, largest=512) == 512  # never past the largest
