"""Qwen-Image 2.1's VAE (AutoencoderKLQwenImage21) against diffusers, on a tiny
seeded model built at test time (qwenimage21_reference.py); skips without
torch and diffusers >= 0.42. The graph decodes RGB: the first 3 of the
model's 4 output channels (alpha is not decoded)."""

import sys
from pathlib import Path

import numpy as np
import pytest

import wgvae

sys.path.insert(0, str(Path(__file__).parent))
import qwenimage21_reference as ref  # noqa: E402

try:
    import torch  # noqa: F401
    from diffusers import AutoencoderKLQwenImage21  # noqa: F401
except Exception as e:  # ImportError, or a diffusers without the class
    pytest.skip(f"SKIPPED: torch + diffusers with AutoencoderKLQwenImage21 are not importable ({e})", allow_module_level=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwenimage21-tiny")
    r = ref.build(d)
    r["dir"] = d
    r["want"] = r["decoded"][:, :3, 0]
    return r


def test_raw_z_matches_diffusers_f32(tiny):
    vae = wgvae.Vae(tiny["dir"], dtype="f32")
    for z in (tiny["z"], tiny["z"][:, :, 0]):  # one frame 5-D, or 4-D
        out = vae.decode(z, raw_latents=True, output="float", tile="off")
        assert out.shape == tiny["want"].shape
        err = float(np.abs(out - tiny["want"]).max())
        print(f"qwenimage21 f32 raw z: max abs error {err:.3e}")
        assert err <= 2e-4


def test_pipeline_latents_and_tokens_match_diffusers(tiny):
    vae = wgvae.Vae(tiny["dir"], dtype="f32")
    maps = vae.decode(tiny["latents"], output="float", tile="off")
    tokens = vae.decode(tiny["latents_packed"], output="float", tile="off", size=tiny["size"])
    for what, out in (("maps", maps), ("tokens", tokens)):
        err = float(np.abs(out - tiny["want"]).max())
        print(f"qwenimage21 f32 from {what}: max abs error {err:.3e}")
        assert err <= 2e-4, what
    # The pipeline's image bytes (round(clamp(x/2 + 0.5) * 255)) within one step.
    u8 = vae.decode(tiny["latents"], tile="off")[0].astype(int)
    want_u8 = np.round(np.clip(tiny["want"][0] / 2 + 0.5, 0, 1) * 255).astype(int).transpose(1, 2, 0)
    assert np.abs(u8 - want_u8).max() <= 1


def test_exact_tiles_equal_untiled(tiny):
    vae = wgvae.Vae(tiny["dir"], dtype="f32")
    whole = vae.decode(tiny["z"], raw_latents=True, output="float", tile="off")
    tiled = vae.decode(tiny["z"], raw_latents=True, output="float", tile="exact", tile_size=16)
    err = float(np.abs(tiled - whole).max())
    print(f"qwenimage21 exact tiles (16 px) vs untiled: {err:.3e}")
    assert err <= 1e-3


@pytest.mark.parametrize("dtype,bound", [("f16", 2e-2), ("bf16", 1e-1)])
def test_half_precision_error_is_measured(tiny, dtype, bound):
    vae = wgvae.Vae(tiny["dir"], dtype=dtype)
    out = vae.decode(tiny["z"], raw_latents=True, output="float", tile="off")
    err = np.abs(out - tiny["want"])
    print(f"qwenimage21 {dtype}: max abs error {err.max():.3e}, mean {err.mean():.3e}")
    assert float(err.max()) <= bound


def test_wrong_latents_are_clear_errors(tiny):
    vae = wgvae.Vae(tiny["dir"], dtype="f32")
    c = tiny["z"].shape[1]
    with pytest.raises(ValueError, match="channels"):
        vae.decode(np.zeros((1, 16, 4, 6), np.float32))  # a Qwen-Image 1 latent
    with pytest.raises(ValueError, match="tokens"):
        vae.decode(tiny["latents_packed"], output="float", size=(16 * 4, 16 * 5))
    with pytest.raises(ValueError, match="frame"):
        vae.decode(np.zeros((1, c, 2, 4, 6), np.float32))


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwenimage21-wide")
    r = ref.build(d, config=ref.WIDE_CONFIG)
    r["dir"] = d
    r["want"] = r["decoded"][:, :3, 0]
    return r


def test_wide_mid_attention_matches_diffusers(wide):
    """A mid-block attention of one 576-channel head (the released one is 1152; both run
    in the kernel's output chunks of 512), untiled and in exact tiles."""
    vae = wgvae.Vae(wide["dir"], dtype="f32")
    for tile in ("off", "exact"):
        out = vae.decode(wide["z"], raw_latents=True, output="float", tile=tile, tile_size=16)
        assert out.shape == wide["want"].shape
        err = float(np.abs(out - wide["want"]).max())
        print(f"qwenimage21 576-wide mid attention f32 ({tile}): max abs error {err:.3e}")
        assert err <= 2e-4, tile
