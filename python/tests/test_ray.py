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


def a(index, name, backend, kind="DiscreteGpu"):
    return {"index": index, "name": name, "backend": backend, "device_type": kind}


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
