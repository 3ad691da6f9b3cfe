"""Adapters, errors, memory estimates and torch interop."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import wgvae
from conftest import PROJECT


def test_adapters_lists_dicts():
    found = wgvae.adapters()
    assert found, "no adapter: is a Vulkan or GL driver installed?"
    for i, a in enumerate(found):
        assert a["index"] == i
        assert {"name", "backend", "device_type", "shader_f16"} <= set(a)


@pytest.fixture(scope="module")
def sd(shared):
    d = shared / "golden" / "aekl-tiny-sd"
    return wgvae.Vae(d, dtype="f32"), np.load(d / "latents.npy"), d


def test_nan_latents_raise_value_error(sd):
    vae, latents, _ = sd
    bad = latents.copy()
    bad[0, 1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="(?i)nan|finite"):
        vae.decode(bad)


def test_wrong_shapes_raise_value_error(sd):
    vae, latents, _ = sd
    with pytest.raises(ValueError, match="channel"):
        vae.decode(np.zeros((1, 16, 12, 16), np.float32))
    with pytest.raises(ValueError):
        vae.decode(np.zeros((12, 16), np.float32))
    with pytest.raises(ValueError):
        vae.decode(latents.astype(np.int32))
    with pytest.raises(ValueError):
        vae.decode(latents, output="png")
    with pytest.raises(ValueError, match="tile"):
        vae.decode(latents, tile="diagonal")
    with pytest.raises(ValueError):
        vae.encode(np.zeros((1, 30, 30, 3), np.uint8))
    with pytest.raises(ValueError):
        vae.decode(latents, max_memory="lots")


def test_missing_file_raises():
    with pytest.raises((ValueError, FileNotFoundError), match="no-such-vae"):
        wgvae.Vae("/nonexistent/no-such-vae.safetensors")
    with pytest.raises(ValueError, match="preset"):
        wgvae.Vae("preset:no-such-preset")


def test_bad_options_raise_value_error(shared):
    d = shared / "golden" / "aekl-tiny-sd"
    with pytest.raises(ValueError, match="dtype"):
        wgvae.Vae(d, dtype="f8")
    with pytest.raises(ValueError):
        wgvae.Vae(d, policy="hoard")


def test_absurd_budget_raises_memory_error(sd):
    vae, latents, _ = sd
    with pytest.raises(MemoryError, match="max_memory|budget"):
        vae.decode(latents, max_memory=1024)
    with pytest.raises(MemoryError):
        vae.memory(size=(96, 128), max_memory="1KiB")


def test_memory_estimate(sd):
    vae, _, _ = sd
    m = vae.memory(size=(96, 128), batch=2, dtype="f32")
    assert m["op"] == "decode" and m["dtype"] == "f32"
    assert m["latents_shape"] == [2, 4, 12, 16] and m["image_shape"] == [2, 3, 96, 128]
    assert 0 < m["weights_bytes"] <= m["peak_allocated_bytes"] <= m["peak_reserved_bytes"]
    e = vae.memory(size=(96, 128), encode=True)
    assert e["op"] == "encode" and e["image_shape"] == [1, 3, 96, 128]


def wgvae_exe():
    p = os.environ.get("WGVAE_BIN") or str(PROJECT / "target" / "debug" / "wgvae")
    return p if Path(p).exists() else None


@pytest.mark.skipif(wgvae_exe() is None, reason="no wgvae binary (cargo build) to compare with")
def test_memory_equals_cli_json(sd):
    vae, _, d = sd
    out = subprocess.run(
        [wgvae_exe(), "memory", "--vae", str(d), "--size", "96x128", "--batch", "2",
         "--dtype", "f32", "--policy", "planned", "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    assert vae.memory(size=(96, 128), batch=2, dtype="f32") == json.loads(out)


def test_torch_tensors_decode_as_numpy(sd):
    torch = pytest.importorskip("torch")
    vae, latents, _ = sd
    ref = vae.decode(latents, output="float")
    t = torch.from_numpy(latents).requires_grad_(True)
    assert np.array_equal(vae.decode(t, output="float"), ref)
    bf16 = vae.decode(torch.from_numpy(latents).to(torch.bfloat16), output="float")
    assert float(np.abs(bf16 - ref).max()) < 0.1
    assert np.array_equal(vae.decode(np.from_dlpack(torch.from_numpy(latents)), output="float"), ref)


class ArrayLike:
    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a


def test_array_protocol_and_dlpack(sd):
    vae, latents, _ = sd
    ref = vae.decode(latents, output="float")
    assert np.array_equal(vae.decode(ArrayLike(latents), output="float"), ref)

    class DlpackOnly:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    if hasattr(np, "from_dlpack"):
        assert np.array_equal(vae.decode(DlpackOnly(latents), output="float"), ref)
    with pytest.raises(ValueError):
        vae.decode(object())
