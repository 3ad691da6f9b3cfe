"""diffusers itself as the reference (skips without torch and diffusers): the tiny SD
AutoencoderKL decoded by diffusers and post-processed by its VaeImageProcessor equals
wgvae's decode of the same pipeline latents."""

import numpy as np
import pytest

import wgvae

# The Rust tests' bound for aekl-tiny-sd's raw output (tests/decode_goldens.rs).
SD_TOLERANCE = 9e-6


def test_diffusers_decode_and_postprocess_equal_wgvae(shared):
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from diffusers.image_processor import VaeImageProcessor

    d = shared / "golden" / "aekl-tiny-sd"
    latents = np.load(d / "latents.npy")
    ref = diffusers.AutoencoderKL.from_pretrained(d, torch_dtype=torch.float32).eval()
    z = torch.from_numpy(latents) / ref.config.scaling_factor + (ref.config.shift_factor or 0.0)
    with torch.no_grad():
        sample = ref.decode(z).sample
    processor = VaeImageProcessor(vae_scale_factor=8)
    # "np" is float in [0, 1]; "pil" rounds that × 255, as below.
    want = (processor.postprocess(sample, output_type="np") * 255).round().astype(np.uint8)

    vae = wgvae.Vae(d, dtype="f32")
    raw = vae.decode(torch.from_numpy(latents), output="float")
    err = float(np.abs(raw - sample.numpy()).max())
    assert err <= SD_TOLERANCE, err
    images = vae.decode(latents)
    assert images.shape == want.shape
    # Equal but for a value that lands on a rounding boundary within float error.
    diff = np.abs(images.astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
