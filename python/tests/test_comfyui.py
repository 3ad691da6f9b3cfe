"""The ComfyUI nodes' functions, called directly (numpy when torch is absent)."""

import sys
from pathlib import Path

import numpy as np
import wgvae

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from comfyui_wgvae import NODE_CLASS_MAPPINGS  # noqa: E402


def test_node_mappings_follow_comfyui_conventions():
    for cls in NODE_CLASS_MAPPINGS.values():
        assert isinstance(cls.INPUT_TYPES()["required"], dict)
        assert hasattr(cls, getattr(cls, "FUNCTION"))
        assert isinstance(cls.RETURN_TYPES, tuple)


def test_decode_node_returns_comfyui_image(shared):
    d = shared / "golden" / "aekl-tiny-sd"
    (vae,) = NODE_CLASS_MAPPINGS["WgvaeLoader"]().load(str(d), dtype="f32")
    latents = np.load(d / "latents.npy")
    # ComfyUI's LATENT holds the VAE's own (unscaled) latents.
    raw = latents / 0.18215
    (image,) = NODE_CLASS_MAPPINGS["WgvaeDecode"]().decode({"samples": raw}, vae, tile="exact", max_memory_mib=0)
    image = np.asarray(image)
    assert image.dtype == np.float32 and image.shape == (1, 96, 128, 3)
    assert 0.0 <= image.min() and image.max() <= 1.0
    want = vae.decode(latents).astype(np.float32) / 255
    assert np.abs(image - want).max() <= 1.01 / 255
    (again,) = NODE_CLASS_MAPPINGS["WgvaeDecode"]().decode({"samples": raw}, vae, tile="auto", max_memory_mib=1024)
    assert np.abs(np.asarray(again) - image).max() <= 1.01 / 255
