"""The goldens through numpy, at the Rust tests' tolerances (tests/decode_goldens.rs)."""

import numpy as np
import pytest

import wgvae
from conftest import psnr, read_png_rgb


def postprocess(raw):
    """diffusers' postprocessing: round(clamp(x/2 + 0.5, 0, 1) * 255), N×3×H×W → N×H×W×3."""
    return np.round(np.clip(raw / 2 + 0.5, 0, 1) * 255).astype(np.uint8).transpose(0, 2, 3, 1)


@pytest.mark.parametrize(
    "name, tolerance",
    [("aekl-tiny-sd", 9e-6), ("aekl-tiny-sd-batch2", 1.9e-5), ("aekl-tiny-flux", 1.4e-5)],
)
def test_autoencoder_kl_matches_diffusers(shared, name, tolerance):
    d = shared / "golden" / name
    vae = wgvae.Vae(d, dtype="f32")
    latents = np.load(d / "latents.npy")
    want = np.load(d / "decoded.npy")
    raw = vae.decode(latents, output="float")
    assert raw.dtype == np.float32 and raw.shape == want.shape
    err = float(np.abs(raw - want).max())
    print(f"{name}: raw max abs error {err:.3e}")
    assert err <= tolerance, f"{name}: raw max abs error {err} > {tolerance}"

    images = vae.decode(latents)
    assert images.dtype == np.uint8 and images.shape == (want.shape[0], want.shape[2], want.shape[3], 3)
    for i, img in enumerate(images):
        png = read_png_rgb(d / f"decoded_{i}.png")
        worst = int(np.abs(img.astype(int) - png.astype(int)).max())
        assert worst <= 1, f"{name}: PNG {i} differs by {worst} > 1"
    assert np.abs(images.astype(int) - postprocess(want).astype(int)).max() <= 1


def test_taef2_astronaut_matches_pytorch(shared):
    g = shared / "golden" / "taef2"
    vae = wgvae.Vae(shared / "weights" / "taef2" / "decoder.safetensors", dtype="f32")
    assert "taef2" in vae.name.lower(), vae.name
    latents = np.load(g / "astronaut.latents.npy")
    want = np.load(g / "astronaut.decoded.npy")
    # One 512² decode (the slow part on a CPU adapter): raw output, and the
    # image quantized as the library does for TAE's [0, 1] range.
    raw = vae.decode(latents, output="float")
    assert raw.shape == want.shape
    err = float(np.abs(raw - want).max())
    assert err <= 1.5e-5, f"astronaut: max abs error {err} > 1.5e-5"
    image = np.round(np.clip(raw[0], 0, 1) * 255).astype(np.uint8).transpose(1, 2, 0)
    p = psnr(image, read_png_rgb(shared / "images" / "astronaut.png"))
    print(f"taef2 astronaut: max abs error {err:.3e}, PSNR {p:.2f} dB (PyTorch 31.2)")
    assert abs(p - 31.2) <= 0.1, p
    # The uint8 path on a crop, C×h×w → one H×W×3 image.
    crop = latents[0, :, :8, :8]
    small = vae.decode(crop)
    assert small.shape == (64, 64, 3) and small.dtype == np.uint8
    small_raw = vae.decode(crop, output="float")
    quantized = np.round(np.clip(small_raw, 0, 1) * 255).astype(int).transpose(1, 2, 0)
    assert np.abs(small.astype(int) - quantized).max() <= 1


def test_autoencoder_kl_encode_matches_diffusers(shared):
    d = shared / "golden" / "aekl-tiny-sd"
    vae = wgvae.Vae(d, dtype="f32")
    png = read_png_rgb(d / "encode_input.png")
    mean = vae.encode(png, raw_latents=True)  # uint8 H×W×3 → C×h×w
    want = np.load(d / "encoded_mean.npy")[0]
    assert mean.shape == want.shape
    assert float(np.abs(mean - want).max()) <= 1e-3
    # The same image as diffusers' float input in [-1, 1].
    x = png.transpose(2, 0, 1)[None].astype(np.float32) / 127.5 - 1
    again = vae.encode(x, raw_latents=True)
    assert float(np.abs(again[0] - mean).max()) <= 1e-5
    scaled = vae.encode(png)
    assert np.allclose(scaled, mean * 0.18215, atol=1e-6)
    # [0, 1] floats: given as such they encode alike; read as [-1, 1] they are warned about.
    unit = png.transpose(2, 0, 1)[None].astype(np.float32) / 255
    assert float(np.abs(vae.encode(unit, raw_latents=True, value_range=(0, 1))[0] - mean).max()) <= 1e-5
    with pytest.warns(UserWarning, match="value_range=\\(0, 1\\)"):
        washed = vae.encode(unit, raw_latents=True)
    assert float(np.abs(washed[0] - mean).max()) > 1e-2
    # Values outside the range are an error, never clipped.
    with pytest.raises(ValueError, match="outside value_range"):
        vae.encode(unit * 255, raw_latents=True)
    with pytest.raises(ValueError, match="value_range"):
        vae.encode(unit, value_range=(1, 0))


def test_dtypes_convert_and_layouts(shared):
    d = shared / "golden" / "aekl-tiny-sd"
    vae = wgvae.Vae(d, dtype="f32")
    latents = np.load(d / "latents.npy")
    ref = vae.decode(latents, output="float")
    assert np.array_equal(vae.decode(latents.astype(np.float64), output="float"), ref)
    f16 = vae.decode(latents.astype(np.float16), output="float")
    assert f16.shape == ref.shape and float(np.abs(f16 - ref).max()) < 0.05
    # Non-contiguous views are copied as they read.
    assert np.array_equal(vae.decode(np.asfortranarray(latents), output="float"), ref)
    # Exact tiles equal the untiled decode up to rounding.
    tiled = vae.decode(latents, tile="exact", tile_size=64, output="float")
    assert float(np.abs(tiled - ref).max()) <= 1e-4
    out = vae.decode(latents, output="float")
    out += 1  # writable


@pytest.mark.parametrize("name", ["flux2-tiny", "flux2-small-decoder-tiny"])
def test_flux2_maps_tokens_and_z_match_diffusers(shared, name):
    d = shared / "golden" / name
    vae = wgvae.Vae(d, dtype="f32")
    want = np.load(d / "decoded.npy")
    h, w = want.shape[2], want.shape[3]
    maps = vae.decode(np.load(d / "latents.npy"), output="float")
    tokens = vae.decode(np.load(d / "latents_packed.npy"), output="float", size=(h, w))
    z = vae.decode(np.load(d / "z.npy"), output="float", raw_latents=True)
    for what, raw in [("maps", maps), ("tokens", tokens), ("z", z)]:
        err = float(np.abs(raw - want).max())
        assert err <= 2e-4, f"{name} from {what}: {err}"
    with pytest.raises(Exception, match="size"):
        vae.decode(np.load(d / "latents_packed.npy"), output="float", size=(16, 16))


def test_qwen_image_matches_diffusers(shared):
    """Qwen-Image (tests/qwen_image.rs): one-frame 5-D pipeline latents and 4-D raw z."""
    d = shared / "golden" / "qwenimage-tiny"
    if not d.is_dir():
        pytest.skip(f"{d} is absent")
    vae = wgvae.Vae(d, dtype="f32")
    want = np.load(d / "decoded.npy")[:, :, 0]
    latents = np.load(d / "latents.npy")
    assert latents.ndim == 5
    raw = vae.decode(latents, output="float")
    assert raw.shape == want.shape
    err = float(np.abs(raw - want).max())
    print(f"qwenimage-tiny: raw max abs error {err:.3e}")
    assert err <= 2e-4
    z = np.load(d / "z.npy")[:, :, 0]
    raw = vae.decode(z, raw_latents=True, output="float")
    assert float(np.abs(raw - want).max()) <= 2e-4
    with pytest.raises(ValueError, match="frames"):
        vae.decode(np.concatenate([latents, latents], axis=2))
