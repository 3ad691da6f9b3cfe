"""Video VAEs from Python: TAEHV and Wan 2.1 goldens, whole clips and streams, errors."""

import json

import numpy as np
import pytest

import wgvae

# The Rust video goldens' bounds (tests/video_goldens.rs runs tighter ones).
TAEHV_TOLERANCE = 2e-3
WAN_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def taehv(shared):
    d = shared / "golden" / "taew2_1-rand"
    vae = wgvae.Vae(d / "taew2_1.safetensors", dtype="f32")
    return vae, np.load(d / "latents.npy"), d


@pytest.fixture(scope="module")
def wan(shared):
    d = shared / "golden" / "wan21-tiny"
    vae = wgvae.Vae(d, dtype="f32")
    return vae, np.load(d / "latents.npy"), d


# Beyond the goldens the tests decode 2×3-latent crops (16×24 pixels): lavapipe on a loaded
# CI machine takes about a minute per whole 64×80 clip.
def crop(latents):
    return np.ascontiguousarray(latents[..., :2, :3])


@pytest.fixture(scope="module")
def taehv_whole(taehv):
    vae, latents, _ = taehv
    return vae.decode_video(crop(latents), output="float")


@pytest.fixture(scope="module")
def wan_whole(wan):
    vae, latents, _ = wan
    return vae.decode_video(crop(latents), output="float", raw_latents=True)


def test_video_vaes_load_through_vae(taehv, wan):
    vae, _, _ = taehv
    assert vae.is_video and vae.layout == "ntchw" and vae.latent_channels == 16 and vae.upscale == 8
    assert vae.frames_for(3) == 9 and vae.dtype == "f32"
    vae, _, _ = wan
    assert vae.is_video and vae.layout == "ncthw" and vae.latent_channels == 16
    assert vae.frames_for(3) == 9


def test_taehv_golden(taehv):
    vae, latents, d = taehv
    got = vae.decode_video(latents, output="float")
    want = np.load(d / "decoded_raw.npy")
    assert got.shape == want.shape == (1, 9, 3, 64, 80)
    err = np.abs(got - want).max()
    assert err <= TAEHV_TOLERANCE, err


def test_wan_golden(wan):
    vae, latents, d = wan
    got = vae.decode_video(latents, output="float", raw_latents=True)
    # diffusers' decode leaves the output unclamped; wgvae clamps as the CLI's --save-raw.
    want = np.clip(np.load(d / "decoded.npy"), -1.0, 1.0)
    assert got.shape == want.shape == (1, 3, 9, 64, 80)
    err = np.abs(got - want).max()
    assert err <= WAN_TOLERANCE, err


def test_uint8_frames_are_the_float_ones_rounded(taehv, taehv_whole, wan, wan_whole):
    vae, latents, _ = taehv
    got = vae.decode_video(crop(latents)[0])  # one video, no batch axis, uint8
    assert got.shape == (9, 16, 24, 3) and got.dtype == np.uint8
    want = np.round(np.clip(taehv_whole[0], 0, 1) * 255).transpose(0, 2, 3, 1)
    assert np.abs(got.astype(np.int16) - want).max() <= 1
    vae, latents, _ = wan
    got = vae.decode_video(crop(latents), raw_latents=True)
    assert got.shape == (1, 9, 16, 24, 3)
    want = np.round((wan_whole[0] / 2 + 0.5) * 255).transpose(1, 2, 3, 0)
    assert np.abs(got[0].astype(np.int16) - want).max() <= 1


@pytest.mark.parametrize("chunk", [1, 2])
def test_taehv_stream_equals_whole_clip(taehv, taehv_whole, chunk):
    vae, latents, _ = taehv
    latents = crop(latents)
    s = vae.stream(output="float")
    parts = [s.push(latents[:, t : t + chunk]) for t in range(0, latents.shape[1], chunk)]
    parts.append(s.finish())
    assert parts[0].shape[1] == 0  # the first push returns before its chunk is decoded
    got = np.concatenate(parts, axis=1)
    assert got.shape == taehv_whole.shape and s.frames_out == 9
    assert np.abs(got - taehv_whole).max() <= 1e-4


def test_wan_stream_equals_whole_clip(wan, wan_whole):
    vae, latents, _ = wan
    latents = crop(latents)
    s = vae.stream(output="float", raw_latents=True)
    parts = [s.push(latents[0, :, t : t + 1]) for t in range(latents.shape[2])]
    parts.append(s.finish())
    got = np.concatenate(parts, axis=1)  # 3×T'×H×W
    assert got.shape == wan_whole.shape[1:]
    assert np.abs(got - wan_whole[0]).max() <= 1e-4
    u8 = vae.stream(raw_latents=True)
    frames = [u8.push(latents[:, :, t : t + 1]) for t in range(latents.shape[2])] + [u8.finish()]
    assert np.concatenate(frames, axis=1).shape == (1, 9, 16, 24, 3)


def test_wan_layout_override_and_pipeline_latents(wan, wan_whole):
    vae, latents, d = wan
    latents = crop(latents)
    # N×T×C×h×w read with layout="ntchw" decodes as the N×C×T×h×w original.
    got = vae.decode_video(latents.transpose(0, 2, 1, 3, 4), layout="ntchw", output="float", raw_latents=True)
    assert np.abs(got - wan_whole).max() <= 1e-5
    # Pipeline latents: the decoder takes z = latents * std + mean.
    config = json.loads((d / "config.json").read_text())
    mean = np.array(config["latents_mean"], np.float32)[None, :, None, None, None]
    std = np.array(config["latents_std"], np.float32)[None, :, None, None, None]
    got = vae.decode_video((latents - mean) / std, output="float")
    assert np.abs(got - wan_whole).max() <= 1e-4


def test_bad_video_inputs_raise_value_error(taehv, shared):
    vae, latents, _ = taehv
    latents = crop(latents)
    bad = latents.copy()
    bad[0, 1, 2, 1, 2] = np.nan
    with pytest.raises(ValueError, match="finite"):
        vae.decode_video(bad)
    with pytest.raises(ValueError, match="channels"):
        vae.decode_video(np.zeros((1, 2, 4, 2, 2), np.float32))
    with pytest.raises(ValueError, match="5-D"):
        vae.decode_video(np.zeros((16, 8, 8), np.float32))
    with pytest.raises(ValueError, match="layout"):
        vae.decode_video(latents, layout="nchw")
    with pytest.raises(ValueError, match="output"):
        vae.decode_video(latents, output="png")
    with pytest.raises(ValueError, match="float"):
        vae.decode_video(latents.astype(np.int32))
    with pytest.raises(ValueError, match="video VAE"):
        vae.decode(latents[0, 0])
    with pytest.raises(ValueError, match="video VAE"):
        vae.encode(np.zeros((1, 64, 64, 3), np.uint8))
    image = wgvae.Vae(shared / "golden" / "aekl-tiny-sd", dtype="f32")
    with pytest.raises(ValueError, match="image VAE"):
        image.decode_video(latents)
    s = vae.stream()
    with pytest.raises(ValueError, match="channels"):
        s.push(np.zeros((1, 4, 2, 3), np.float32))
    with pytest.raises(ValueError, match="N must be 1"):
        s.push(np.zeros((2, 1, 16, 2, 3), np.float32))
    # A refused chunk leaves the stream usable.
    s.push(latents[0, :1])
    with pytest.raises(ValueError, match="same latent size"):
        s.push(np.zeros((1, 16, 4, 4), np.float32))
    assert s.finish().shape == (1, 16, 24, 3)


# The 2026 video VAEs (diffusers 0.42.1 goldens, pipeline latents in, vae.decode(z).sample out).
@pytest.mark.parametrize(
    "name, channels, upscale, causal",
    [("wan22-tiny", 48, 16, True), ("hunyuanvideo15-tiny", 32, 16, True), ("ltx2-tiny", 4, 32, False),
     ("minimax-h3-tiny", 8, 16, True)],
)
def test_2026_video_goldens(shared, name, channels, upscale, causal):
    d = shared / "golden" / name
    vae = wgvae.Vae(d, dtype="f32")
    assert vae.is_video and vae.layout == "ncthw"
    assert vae.latent_channels == channels and vae.upscale == upscale
    latents = np.load(d / "latents.npy")
    want = np.load(d / "decoded.npy")
    got = vae.decode_video(latents, output="float")
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= WAN_TOLERANCE
    raw = vae.decode_video(np.load(d / "z.npy"), output="float", raw_latents=True)
    assert np.abs(raw - want).max() <= WAN_TOLERANCE
    s = vae.stream(output="float")
    if causal:
        parts = [s.push(latents[0, :, j : j + 1]) for j in range(latents.shape[2])]
        parts.append(s.finish())
        streamed = np.concatenate(parts, axis=1)
        assert np.abs(streamed - want[0]).max() <= WAN_TOLERANCE
    else:
        s.push(latents[0, :, :1])
        with pytest.raises(Exception, match="not causal"):
            s.push(latents[0, :, 1:2])
    # The progress path streams too (the whole clip at once where not causal).
    seen = []
    prog = vae.decode_video(latents, output="float", progress=lambda d, t, s: seen.append((d, t)))
    assert np.abs(prog - want).max() <= WAN_TOLERANCE and seen[-1] == (latents.shape[2], latents.shape[2])


def test_ltx2_causal_decoder_matches_diffusers(shared, tmp_path):
    """The ltx2-tiny weights with decoder_causal true: wgvae's whole clip and its stream
    against diffusers' own causal decode (only where torch and diffusers import)."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    import shutil

    d = shared / "golden" / "ltx2-tiny"
    folder = tmp_path / "ltx2-causal"
    folder.mkdir()
    cfg = json.loads((d / "config.json").read_text())
    cfg["decoder_causal"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    shutil.copy(d / "diffusion_pytorch_model.safetensors", folder / "diffusion_pytorch_model.safetensors")
    z = np.load(d / "z.npy")
    ref = diffusers.AutoencoderKLLTX2Video.from_pretrained(folder).eval()
    with torch.no_grad():
        want = ref.decode(torch.from_numpy(z)).sample.numpy()
    vae = wgvae.Vae(folder, dtype="f32")
    got = vae.decode_video(z, output="float", raw_latents=True)
    assert got.shape == want.shape and np.abs(got - want).max() <= WAN_TOLERANCE
    s = vae.stream(output="float", raw_latents=True)
    parts = [s.push(z[0, :, j : j + 1]) for j in range(z.shape[2])]
    parts.append(s.finish())
    assert np.abs(np.concatenate(parts, axis=1) - want[0]).max() <= WAN_TOLERANCE


@pytest.mark.parametrize("t", [4, 5, 13])
def test_minimax_h3_matches_diffusers_on_longer_videos(shared, t):
    """More clips than the golden's two, every padding case (T mod 3), frames over 256 px:
    wgvae's whole video and its stream against diffusers' own decode, tiled as it ships
    and with tiling off (only where torch and diffusers import)."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    pytest.importorskip("accelerate")  # diffusers loads this class with low_cpu_mem_usage only
    d = shared / "golden" / "minimax-h3-tiny"
    z = np.random.default_rng(t).standard_normal((1, 8, t, 17, 5)).astype(np.float32)
    ref = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(d).eval()
    vae = wgvae.Vae(d, dtype="f32")
    # Its default (256-px tiles, here 2×1 of them) and untiled, each as diffusers.
    for tile in ("auto", "off"):
        if tile == "off":
            ref.disable_tiling()
        with torch.no_grad():
            want = ref.decode(torch.from_numpy(z)).sample.numpy()
        got = vae.decode_video(z, output="float", raw_latents=True, tile=tile)
        assert got.shape == want.shape and np.abs(got - want).max() <= WAN_TOLERANCE, tile
        s = vae.stream(output="float", raw_latents=True, tile=tile)
        parts = [s.push(z[0, :, j : j + 2]) for j in range(0, t, 2)]
        parts.append(s.finish())
        assert np.abs(np.concatenate(parts, axis=1) - want[0]).max() <= WAN_TOLERANCE, tile
