"""examples/ray_decode.py: the GPU → adapter mapping, and a run on a local Ray cluster (when ray is installed)."""

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

import wgvae
from conftest import PROJECT, read_png_rgb

spec = importlib.util.spec_from_file_location("ray_decode", PROJECT / "examples" / "ray_decode.py")
ray_decode = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ray_decode)


def a(index, name, backend, kind="DiscreteGpu", bus=""):
    return {"index": index, "name": name, "backend": backend, "device_type": kind, "pci_bus_id": bus}


def test_adapter_for_maps_ray_gpu_ids_to_wgpu_adapters():
    adapters = [
        a(0, "llvmpipe", "Vulkan", "Cpu"),
        a(1, "GPU A", "Gl"),
        a(2, "GPU A", "Vulkan"),
        a(3, "GPU B", "Vulkan"),
        a(4, "GPU B", "Gl"),
    ]
    assert ray_decode.adapter_for([], adapters) is None
    assert ray_decode.adapter_for([0], adapters) == 2  # GPU A, its Vulkan adapter
    assert ray_decode.adapter_for(["1"], adapters) == 3
    assert ray_decode.adapter_for([2], adapters) is None  # only two GPUs
    assert ray_decode.adapter_for([0], [a(0, "llvmpipe", "Vulkan", "Cpu")]) is None


def test_adapters_report_a_pci_bus_id():
    for found in wgvae.adapters():
        assert isinstance(found["pci_bus_id"], str)
        assert found["pci_bus_id"] == "" or ray_decode.normalize_bus_id(found["pci_bus_id"])


def test_bus_ids_normalize():
    assert ray_decode.normalize_bus_id("00000000:01:00.0") == "0000:01:00.0"  # nvidia-smi
    assert ray_decode.normalize_bus_id("0000:C1:00.0") == "0000:c1:00.0"  # wgpu / Vulkan
    assert ray_decode.normalize_bus_id("01:00.0") == "0000:01:00.0"
    assert ray_decode.normalize_bus_id("") is None and ray_decode.normalize_bus_id("GPU-1234") is None


SMI = """0, GPU-aaaa, 00000000:41:00.0
1, GPU-bbbb, 00000000:01:00.0
"""


def test_nvidia_smi_and_proc_parse(tmp_path):
    assert ray_decode.parse_nvidia_smi(SMI) == {
        "0": "0000:41:00.0",
        "GPU-aaaa": "0000:41:00.0",
        "1": "0000:01:00.0",
        "GPU-bbbb": "0000:01:00.0",
    }
    assert ray_decode.parse_nvidia_smi("NVIDIA-SMI has failed\n") == {}
    for bus, minor, uuid in [("0000:41:00.0", 0, "GPU-aaaa"), ("0000:01:00.0", 1, "GPU-bbbb")]:
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(
            f"Model: \t\t NVIDIA H100\nIRQ:   \t\t 30\nGPU UUID: \t\t {uuid}\nDevice Minor: \t\t {minor}\n"
        )
    (tmp_path / "not-a-bus").mkdir()
    assert ray_decode.parse_proc_gpus(tmp_path) == ray_decode.parse_nvidia_smi(SMI)
    assert ray_decode.parse_proc_gpus(tmp_path / "missing") == {}


def test_adapter_for_maps_by_pci_bus_id():
    # Enumeration order differs from NVML's: bus ids decide, Vulkan before GL.
    adapters = [
        a(0, "NVIDIA H100", "Vulkan", bus="0000:01:00.0"),
        a(1, "NVIDIA H100", "Vulkan", bus="0000:41:00.0"),
        a(2, "NVIDIA H100", "Gl"),
        a(3, "llvmpipe", "Vulkan", "Cpu", bus=""),
    ]
    bus_ids = ray_decode.parse_nvidia_smi(SMI)
    assert ray_decode.adapter_for([0], adapters, bus_ids) == 1
    assert ray_decode.adapter_for(["1"], adapters, bus_ids) == 0
    assert ray_decode.adapter_for(["GPU-aaaa"], adapters, bus_ids) == 1
    # A GPU no adapter reports a bus id for: the index mapping (best backend first).
    assert ray_decode.adapter_for([0], [a(0, "GPU", "Gl"), a(1, "GPU", "Vulkan")], bus_ids) == 1
    # No NVIDIA tools: by index (identical GPUs too); an unknown UUID: wgvae's default.
    assert ray_decode.adapter_for([0], adapters, {}) == 0
    assert ray_decode.adapter_for([1], adapters, {}) == 1
    assert ray_decode.adapter_for(["GPU-cccc"], adapters, {}) is None


def test_png_writer_round_trips(tmp_path):
    rgb = (np.arange(5 * 7 * 3) % 256).astype(np.uint8).reshape(5, 7, 3)
    ray_decode.write_png(tmp_path / "x.png", rgb)
    assert np.array_equal(read_png_rgb(tmp_path / "x.png"), rgb)


def test_ray_decode_equals_single_process(shared, tmp_path):
    ray = pytest.importorskip("ray")
    d = shared / "golden" / "aekl-tiny-sd"
    latents = np.load(d / "latents.npy")
    paths = []
    for i in range(3):
        p = tmp_path / f"lat{i}.npy"
        np.save(p, latents * (1 + 0.1 * i))
        paths.append(p)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        pngs = ray_decode.decode_files(paths, d, tmp_path / "out", concurrency=2, num_gpus=0, dtype="f32")
    finally:
        ray.shutdown()
    assert [Path(p).name for p in pngs] == ["lat0.png", "lat1.png", "lat2.png"]
    vae = wgvae.Vae(d, dtype="f32")
    for p, z in zip(pngs, paths):
        assert np.array_equal(read_png_rgb(p), vae.decode(np.load(z))[0])
