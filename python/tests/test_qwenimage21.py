"""Qwen-Image 2.1's VAE (AutoencoderKLQwenImage21) against diffusers, on a tiny
seeded model built at test time (qwenimage21_reference.py); skips without
torch and diffusers >= 0.42. Images are RGBA (out_channels 4, as released):
the alpha channel is checked like RGB; a 3-channel config decodes RGB."""

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
    r["want"] = r["decoded"][:, :, 0]
    return r


def _u8(x):
    """diffusers' postprocess: round(clamp(x / 2 + 0.5, 0, 1) * 255), NCHW -> NHWC."""
    return np.round(np.clip(x / 2 + 0.5, 0, 1) * 255).astype(np.uint8).transpose(0, 2, 3, 1)


def test_raw_z_matches_diffusers_f32(tiny):
    vae = wgvae.Vae(tiny["dir"], dtype="f32")
    for z in (tiny["z"], tiny["z"][:, :, 0]):  # one frame 5-D, or 4-D
        out = vae.decode(z, raw_latents=True, output="float", tile="off")
        assert out.shape == tiny["want"].shape == (1, 4, 64, 96)
        err = float(np.abs(out - tiny["want"]).max())
        alpha = float(np.abs(out[:, 3] - tiny["want"][:, 3]).max())
        print(f"qwenimage21 f32 raw z: max abs error {err:.3e} (alpha {alpha:.3e})")
        assert err <= 2e-4
    # The alpha is a real channel here (not constant), so the check can fail.
    assert np.ptp(tiny["want"][:, 3]) > 0.1


def test_pipeline_latents_and_tokens_match_diffusers(tiny):
    vae = wgvae.Vae(tiny["dir"], dtype="f32")
    maps = vae.decode(tiny["latents"], output="float", tile="off")
    tokens = vae.decode(tiny["latents_packed"], output="float", tile="off", size=tiny["size"])
    for what, out in (("maps", maps), ("tokens", tokens)):
        err = float(np.abs(out - tiny["want"]).max())
        print(f"qwenimage21 f32 from {what}: max abs error {err:.3e}")
        assert err <= 2e-4, what
    # The pipeline's RGBA image bytes (round(clamp(x/2 + 0.5) * 255)) within one step.
    u8 = vae.decode(tiny["latents"], tile="off")
    assert u8.shape == (1, 64, 96, 4) and u8.dtype == np.uint8
    assert np.abs(u8.astype(int) - _u8(tiny["want"]).astype(int)).max() <= 1
    # ... and exactly the CPU mapping of our own float output, alpha included.
    assert np.array_equal(u8, _u8(maps))


def test_exact_tiles_equal_untiled(tiny):
    vae = wgvae.Vae(tiny["dir"], dtype="f32")
    whole = vae.decode(tiny["z"], raw_latents=True, output="float", tile="off")
    tiled = vae.decode(tiny["z"], raw_latents=True, output="float", tile="exact", tile_size=16)
    assert tiled.shape == whole.shape == (1, 4, 64, 96)
    err = float(np.abs(tiled - whole).max())
    print(f"qwenimage21 exact tiles (16 px) vs untiled: {err:.3e}")
    assert err <= 1e-3
    fast = vae.decode(tiny["z"], raw_latents=True, tile="fast", tile_size=32)
    assert fast.shape == (1, 64, 96, 4)


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
    r["want"] = r["decoded"][:, :, 0]
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


def test_diffusers_drop_in_matches_diffusers(tiny):
    """wgvae.diffusers.AutoencoderKLQwenImage21 gives what diffusers' class gives:
    N×4×1×H×W RGBA from the same z, and the pipeline's RGBA PIL images."""
    import torch
    from diffusers.image_processor import VaeImageProcessor

    import wgvae.diffusers as wd

    ours = wd.AutoencoderKLQwenImage21.from_pretrained(tiny["dir"], torch_dtype=torch.float32)
    assert ours.config.out_channels == 4 and ours.config.z_dim == tiny["z"].shape[1]
    z = torch.from_numpy(tiny["z"])
    got = ours.decode(z).sample
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == tiny["decoded"].shape
    err = float((got - torch.from_numpy(tiny["decoded"])).abs().max())
    print(f"qwenimage21 drop-in f32: max abs error {err:.3e}")
    assert err <= 2e-4
    # The pipeline's postprocess (pipeline_qwenimage21: decode(...)[0][:, :, 0]).
    proc = VaeImageProcessor(vae_scale_factor=16)
    (image,) = proc.postprocess(ours.decode(z, return_dict=False)[0][:, :, 0], output_type="pil")
    (want,) = proc.postprocess(torch.from_numpy(tiny["decoded"])[:, :, 0], output_type="pil")
    assert image.mode == want.mode == "RGBA"
    diff = np.abs(np.asarray(image).astype(int) - np.asarray(want).astype(int))
    assert diff.max() <= 1
    with pytest.raises(NotImplementedError, match="encoder"):
        ours.encode(torch.zeros(1, 4, 64, 96))
    with pytest.raises(ValueError, match="AutoencoderKLQwenImage21"):
        wd.AutoencoderKLQwenImage.from_pretrained(tiny["dir"])


@pytest.fixture(scope="module")
def rgb(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwenimage21-rgb")
    r = ref.build(d, config=dict(ref.CONFIG, out_channels=3))
    r["dir"] = d
    return r


def test_three_channel_config_decodes_rgb(rgb):
    vae = wgvae.Vae(rgb["dir"], dtype="f32")
    assert vae.image_channels == 3
    out = vae.decode(rgb["z"], raw_latents=True, output="float", tile="off")
    want = rgb["decoded"][:, :, 0]
    assert out.shape == want.shape == (1, 3, 64, 96)
    assert float(np.abs(out - want).max()) <= 2e-4
    assert vae.decode(rgb["z"], raw_latents=True, tile="off").shape == (1, 64, 96, 3)


def test_other_out_channels_are_refused(tiny, tmp_path):
    import json
    import shutil

    cfg = json.loads((tiny["dir"] / "config.json").read_text())
    cfg["out_channels"] = 5
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    name = "diffusion_pytorch_model.safetensors"
    shutil.copy(tiny["dir"] / name, tmp_path / name)
    with pytest.raises(Exception, match=r"config\.json.*out_channels 5 is not an image.*3 \(RGB\) or 4"):
        wgvae.Vae(tmp_path, dtype="f32")
