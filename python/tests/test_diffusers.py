"""diffusers itself as the reference, and the `wgvae.diffusers` drop-in classes.

Without torch (as CI): the drop-in's config, numpy decode / encode against
`wgvae.Vae` and the goldens, Hub ids through an offline huggingface_hub cache
(skipped without huggingface_hub). With torch + diffusers: the drop-in against
diffusers' own classes on the goldens, and inside real pipelines
(StableDiffusionPipeline, WanPipeline) in place of diffusers' VAE.
Run the torch part with: PYTHONPATH=python <python with torch, diffusers,
transformers> -m pytest -q python/tests/test_diffusers.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import wgvae
from wgvae import diffusers as wd

# The Rust tests' bounds (tests/decode_goldens.rs, encode_goldens.rs, python/tests/test_video.py).
SD_TOLERANCE = 9e-6
FLUX2_TOLERANCE = 2e-4
QWEN_TOLERANCE = 2e-4
WAN_TOLERANCE = 1e-3
ENCODE_TOLERANCE = 1e-3


def _encode_input(d):
    from conftest import read_png_rgb

    png = read_png_rgb(d / "encode_input.png").astype(np.float32)
    return (png / 127.5 - 1.0).transpose(2, 0, 1)[None].copy()


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


# --- without torch: numpy in, numpy out ---------------------------------------------------------


def test_config_is_read_only_with_attributes_and_defaults(shared):
    d = shared / "golden" / "aekl-tiny-sd"
    vae = wd.AutoencoderKL.from_pretrained(d, precision="f32")
    cfg = json.loads((d / "config.json").read_text())
    assert vae.config.scaling_factor == cfg["scaling_factor"] == vae.config["scaling_factor"]
    assert list(vae.config.block_out_channels) == cfg["block_out_channels"]
    assert vae.config.shift_factor is None
    with pytest.raises(TypeError, match="read-only"):
        vae.config["scaling_factor"] = 1.0
    with pytest.raises(TypeError, match="read-only"):
        vae.config.scaling_factor = 1.0
    with pytest.raises(AttributeError):
        vae.config.no_such_key
    # The Wan folder: config.json values, diffusers' defaults for what it lacks.
    wan = wd.AutoencoderKLWan.from_pretrained(shared / "golden" / "wan21-tiny", precision="f32")
    assert wan.config.z_dim == 16 and wan.config.scale_factor_spatial == 8 and wan.config.scale_factor_temporal == 4
    assert len(wan.config.latents_mean) == len(wan.config.latents_std) == 16


def test_wrong_class_and_missing_encoders_say_what_works(shared):
    with pytest.raises(ValueError, match="AutoencoderKLWan"):
        wd.AutoencoderKL.from_pretrained(shared / "golden" / "wan21-tiny")
    with pytest.raises(ValueError, match="AutoencoderKLWan"):
        wd.AutoencoderKLHunyuanVideo15.from_pretrained(shared / "golden" / "wan22-tiny")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        wd.AutoencoderKL.from_pretrained(shared / "golden" / "no-such-folder")
    qwen = wd.AutoencoderKLQwenImage.from_pretrained(shared / "golden" / "qwenimage-tiny", precision="f32")
    with pytest.raises(NotImplementedError, match="decode works"):
        qwen.encode(np.zeros((1, 3, 1, 16, 16), np.float32))
    with pytest.warns(UserWarning, match="ignores"):
        wd.AutoencoderKL.from_pretrained(shared / "golden" / "aekl-tiny-sd", use_safetensors=True)


def test_numpy_decode_equals_wgvae_raw_decode(shared):
    d = shared / "golden" / "aekl-tiny-sd"
    vae = wd.AutoencoderKL.from_pretrained(d, precision="f32")
    latents = np.load(d / "latents.npy")
    z = latents / vae.config.scaling_factor
    out = vae.decode(z)
    assert isinstance(out.sample, np.ndarray)
    want = wgvae.Vae(d, dtype="f32").decode(latents, output="float")
    np.testing.assert_array_equal(out.sample, out[0])
    assert out.sample.shape == want.shape
    assert float(np.abs(out.sample - want).max()) <= 1e-6
    assert float(np.abs(out.sample - np.load(d / "decoded.npy")).max()) <= SD_TOLERANCE
    # Slicing decodes image by image: the same images.
    vae.enable_slicing()
    two = vae.decode(np.concatenate([z, z[:, :, ::-1].copy()]), return_dict=False)[0]
    assert float(np.abs(two[:1] - out.sample).max()) <= 1e-6
    # enable_tiling is diffusers' blended tiles: at 32-px tiles the seams show.
    vae.disable_slicing()
    vae.enable_tiling(tile_sample_min_size=32)
    seams = float(np.abs(vae.decode(z).sample - out.sample).max())
    vae.disable_tiling()
    assert seams > 1e-2, seams


def test_enable_tiling_reproduces_diffusers_tiled_decode(shared):
    """aekl-tiny-sd-tiled: diffusers' own tiled decode at 128-px tiles (seams and all) is what
    enable_tiling(tile_sample_min_size=128) gives; tests/tiled_decode.rs' bound (1.3e-5)."""
    d = shared / "golden" / "aekl-tiny-sd-tiled"
    vae = wd.AutoencoderKL.from_pretrained(d, precision="f32")
    z = np.load(d / "latents.npy") / vae.config.scaling_factor
    vae.enable_tiling(tile_sample_min_size=128)
    tiled = vae.decode(z).sample
    err = float(np.abs(tiled - np.load(d / "decoded_diffusers_tiled.npy")).max())
    seams = float(np.abs(tiled - np.load(d / "decoded.npy")).max())
    assert err <= 1.3e-5 and seams > 0.1, (err, seams)


def test_numpy_encode_latent_dist_equals_golden(shared):
    d = shared / "golden" / "aekl-tiny-sd"
    vae = wd.AutoencoderKL.from_pretrained(d, precision="f32")
    dist = vae.encode(_encode_input(d)).latent_dist
    em = float(np.abs(dist.mean - np.load(d / "encoded_mean.npy")).max())
    es = float(np.abs(dist.std - np.load(d / "encoded_std.npy")).max())
    assert em <= ENCODE_TOLERANCE and es <= ENCODE_TOLERANCE, (em, es)
    np.testing.assert_array_equal(dist.mode(), dist.mean)
    np.testing.assert_allclose(dist.var, dist.std**2, rtol=1e-6)
    a, b = dist.sample(np.random.default_rng(3)), dist.sample(np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    assert 0.2 < float(np.abs((a - dist.mean) / dist.std).mean()) < 2.0


def _hub_cache(tmp_path, golden, repo="wgvae-test/tiny-sd"):
    """A huggingface_hub cache holding `repo` with the golden as its vae/ (links, no copies)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "hub" / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit / "vae"
    snap.mkdir(parents=True)
    for name in ("config.json", "diffusion_pytorch_model.safetensors"):
        (snap / name).symlink_to(golden / name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return tmp_path / "hub", repo


def test_hub_id_resolves_through_an_offline_cache(shared, tmp_path):
    why = "SKIPPED: huggingface_hub is not installed (pip install huggingface_hub)"
    pytest.importorskip("huggingface_hub", reason=why)
    d = shared / "golden" / "aekl-tiny-sd"
    cache, repo = _hub_cache(tmp_path, d)
    # A fresh interpreter: huggingface_hub reads HF_HUB_OFFLINE / HF_HUB_CACHE when imported.
    code = (
        "import sys, numpy as np; from wgvae import diffusers as wd;"
        f"v = wd.AutoencoderKL.from_pretrained({repo!r}, subfolder='vae', precision='f32');"
        f"z = np.load({str(d / 'latents.npy')!r}) / v.config.scaling_factor;"
        "print(v.config.scaling_factor, float(np.abs(v.decode(z).sample - np.load(sys.argv[1])).max()))"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(wgvae.__file__).parents[1])] + sys.path)
    run = subprocess.run([sys.executable, "-c", code, str(d / "decoded.npy")], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    scale, err = run.stdout.split()[-2:]
    assert float(scale) == 0.18215 and float(err) <= SD_TOLERANCE, run.stdout
    # An id the cache does not hold fails offline, naming it.
    bad = code.replace(repo, "wgvae-test/absent")
    run = subprocess.run([sys.executable, "-c", bad, str(d / "decoded.npy")], env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "absent" in run.stderr


# --- with torch + diffusers: against diffusers' own classes ------------------------------------


@pytest.fixture(scope="module")
def torch_diffusers():
    torch = pytest.importorskip("torch", reason="SKIPPED: torch is not installed (the diffusers comparisons need it)")
    diffusers = pytest.importorskip("diffusers", reason="SKIPPED: diffusers is not installed")
    return torch, diffusers


@pytest.mark.parametrize(
    "name, cls, z_file, tol",
    [
        ("aekl-tiny-sd", "AutoencoderKL", None, SD_TOLERANCE),
        ("flux2-tiny", "AutoencoderKLFlux2", "z.npy", FLUX2_TOLERANCE),
        ("qwenimage-tiny", "AutoencoderKLQwenImage", "z.npy", QWEN_TOLERANCE),
        ("wan21-tiny", "AutoencoderKLWan", "latents.npy", WAN_TOLERANCE),
    ],
)
def test_decode_equals_diffusers(shared, torch_diffusers, name, cls, z_file, tol):
    torch, diffusers = torch_diffusers
    d = shared / "golden" / name
    ref = getattr(diffusers, cls).from_pretrained(d, torch_dtype=torch.float32).eval()
    ours = getattr(wd, cls).from_pretrained(d, torch_dtype=torch.float32)
    assert isinstance(ours, torch.nn.Module) and ours.dtype == torch.float32 and ours.device == torch.device("cpu")
    plain = lambda v: list(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
    missing = [k for k in ref.config if not k.startswith("_") and k not in ours.config]
    assert not missing, f"config keys diffusers has and the drop-in lacks: {missing}"
    for k, v in ref.config.items():
        if not k.startswith("_"):
            assert plain(ours.config[k]) == plain(v), (k, ours.config[k], v)
    if z_file is None:
        z = torch.from_numpy(np.load(d / "latents.npy")) / ref.config.scaling_factor
    else:
        z = torch.from_numpy(np.load(d / z_file))
    with torch.no_grad():
        want = ref.decode(z).sample
    got = ours.decode(z).sample
    assert isinstance(got, torch.Tensor) and got.dtype == z.dtype and got.device == z.device
    assert got.shape == want.shape
    err = float((got - want).abs().max())
    print(f"{name}: drop-in decode vs diffusers max abs {err:.3e}")
    assert err <= tol, err
    # float64 latents in, float64 images out (diffusers gives z's dtype too when the model runs in it).
    assert ours.decode(z.double(), return_dict=False)[0].dtype == torch.float64
    if cls == "AutoencoderKLFlux2":
        assert torch.equal(ours.bn.running_mean, ref.bn.running_mean)
        assert torch.equal(ours.bn.running_var, ref.bn.running_var)


@pytest.mark.parametrize("name, tol", [("aekl-tiny-sd", ENCODE_TOLERANCE), ("flux2-tiny", FLUX2_TOLERANCE)])
def test_encode_latent_dist_equals_diffusers(shared, torch_diffusers, name, tol):
    torch, diffusers = torch_diffusers
    d = shared / "golden" / name
    cls = "AutoencoderKL" if name.startswith("aekl") else "AutoencoderKLFlux2"
    ref = getattr(diffusers, cls).from_pretrained(d, torch_dtype=torch.float32).eval()
    ours = getattr(wd, cls).from_pretrained(d, torch_dtype=torch.float32)
    x = torch.from_numpy(_encode_input(d))
    with torch.no_grad():
        want = ref.encode(x).latent_dist
    got = ours.encode(x).latent_dist
    for what in ("mean", "std", "var", "logvar"):
        a, b = getattr(got, what), getattr(want, what)
        assert isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        err = float((a - b).abs().max())
        print(f"{name}: latent_dist.{what} max abs {err:.3e}")
        assert err <= (tol if what != "logvar" else 10 * tol), (what, err)
    assert torch.equal(got.mode(), got.mean)
    # The same generator draws the same ε as diffusers: the samples agree as the means do.
    s_ours = got.sample(torch.Generator().manual_seed(7))
    s_ref = want.sample(torch.Generator().manual_seed(7))
    err = float((s_ours - s_ref).abs().max())
    print(f"{name}: latent_dist.sample(generator) max abs {err:.3e}")
    assert err <= 4 * tol, err
    assert float((s_ours - got.mean).abs().max()) > 10 * tol  # a draw, not the mean


def _tiny_unet(torch, diffusers):
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=32,
    ).eval()


def test_stable_diffusion_pipeline_with_wgvae_vae_gives_diffusers_images(shared, torch_diffusers):
    """A tiny random StableDiffusionPipeline assembled offline (prompt embeddings given, so no
    tokenizer / text encoder); its VAE is the aekl-tiny-sd golden, loaded by diffusers, then by wgvae."""
    pytest.importorskip("transformers", reason="SKIPPED: diffusers pipelines need transformers")
    torch, diffusers = torch_diffusers
    d = shared / "golden" / "aekl-tiny-sd"
    pipe = diffusers.StableDiffusionPipeline(
        vae=diffusers.AutoencoderKL.from_pretrained(d, torch_dtype=torch.float32).eval(),
        text_encoder=None,
        tokenizer=None,
        unet=_tiny_unet(torch, diffusers),
        scheduler=diffusers.DDIMScheduler(steps_offset=1, clip_sample=False),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    embeds = torch.randn(1, 7, 32, generator=torch.Generator().manual_seed(1))
    negative = torch.randn(1, 7, 32, generator=torch.Generator().manual_seed(2))

    def run(output_type):
        out = pipe(
            prompt_embeds=embeds,
            negative_prompt_embeds=negative,
            height=96,
            width=128,
            num_inference_steps=2,
            guidance_scale=3.0,
            generator=torch.Generator().manual_seed(0),
            output_type=output_type,
        ).images
        return np.stack([np.asarray(i) for i in out]) if output_type == "pil" else np.asarray(out)

    ref_pil, ref_np = run("pil"), run("np")
    pipe.vae = wd.AutoencoderKL.from_pretrained(d, torch_dtype=torch.float32)
    pipe.to("cpu")  # the pipeline moves its modules, ours included
    assert pipe.components["vae"] is pipe.vae and pipe.device == torch.device("cpu")
    got_pil, got_np = run("pil"), run("np")
    assert ref_pil.dtype == got_pil.dtype == np.uint8 and ref_pil.shape == got_pil.shape == (1, 96, 128, 3)
    assert ref_pil.std() > 10  # an image, not a constant
    diff = np.abs(got_pil.astype(int) - ref_pil.astype(int))
    err_np = float(np.abs(got_np - ref_np).max())
    off = (diff > 0).mean()
    print(f"StableDiffusionPipeline: pil max {diff.max()} ({off:.2e} of values off), np max abs {err_np:.2e}")
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
    assert err_np <= 1 / 255 and np.abs(np.round(got_np * 255) - np.round(ref_np * 255)).max() <= 1


def test_wan_pipeline_with_wgvae_vae_gives_diffusers_frames(shared, torch_diffusers):
    """A tiny random WanPipeline (prompt embeddings given) with the wan21-tiny VAE, diffusers' then wgvae's."""
    pytest.importorskip("transformers", reason="SKIPPED: diffusers pipelines need transformers")
    torch, diffusers = torch_diffusers
    d = shared / "golden" / "wan21-tiny"
    torch.manual_seed(0)
    transformer = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ).eval()
    pipe = diffusers.WanPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=transformer,
        vae=diffusers.AutoencoderKLWan.from_pretrained(d, torch_dtype=torch.float32).eval(),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    pipe.set_progress_bar_config(disable=True)
    embeds = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    negative = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(2))

    def run():
        return pipe(
            prompt_embeds=embeds,
            negative_prompt_embeds=negative,
            height=32,
            width=48,
            num_frames=5,
            num_inference_steps=2,
            guidance_scale=3.0,
            generator=torch.Generator().manual_seed(0),
            output_type="np",
        ).frames

    ref = np.asarray(run())
    pipe.vae = wd.AutoencoderKLWan.from_pretrained(d, torch_dtype=torch.float32)
    got = np.asarray(run())
    assert got.shape == ref.shape == (1, 5, 32, 48, 3)
    assert ref.std() > 0.02
    err = float(np.abs(got - ref).max())
    print(f"WanPipeline: frames max abs {err:.2e} (×255: {err * 255:.3f})")
    assert np.abs(np.round(got * 255) - np.round(ref * 255)).max() <= 1


def test_autoencoder_tiny_equals_diffusers(torch_diffusers, tmp_path):
    """A random diffusers AutoencoderTiny (taesd's layout; no pretrained weights here) saved to tmp_path."""
    torch, diffusers = torch_diffusers
    torch.manual_seed(0)
    ref = diffusers.AutoencoderTiny().eval()
    with torch.no_grad():  # N(0, 1 / fan_in) weights: larger outputs than the default init's ~0.03
        for p in ref.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, (1.0 / p[0].numel()) ** 0.5)
    ref.save_pretrained(tmp_path)
    ours = wd.AutoencoderTiny.from_pretrained(tmp_path, torch_dtype=torch.float32)
    assert ours.config.latent_channels == 4 and ours.config.scaling_factor == 1.0
    z = torch.randn(2, 4, 8, 12, generator=torch.Generator().manual_seed(0))
    x = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        want, want_latents = ref.decode(z).sample, ref.encode(x).latents
    got, got_latents = ours.decode(z).sample, ours.encode(x).latents
    assert got.shape == want.shape and got_latents.shape == want_latents.shape
    err = float((got - want).abs().max())
    lerr = float((got_latents - want_latents).abs().max())
    print(f"AutoencoderTiny: decode max abs {err:.2e} (output std {float(want.std()):.2f}), encode {lerr:.2e}")
    assert float(want.std()) > 0.1
    # Measured 4.2e-6 / 1.2e-6 (output std 0.38).
    assert err <= 2e-5 and lerr <= 1e-5, (err, lerr)


def test_flux2_pipeline_with_wgvae_vae_gives_diffusers_images(shared, torch_diffusers):
    """A tiny random Flux2Pipeline (prompt embeddings given) with the flux2-tiny VAE, diffusers' then
    wgvae's: text to image, and with a reference image, which goes through vae.encode and vae.bn."""
    pytest.importorskip("transformers", reason="SKIPPED: diffusers pipelines need transformers")
    torch, diffusers = torch_diffusers
    from PIL import Image

    d = shared / "golden" / "flux2-tiny"
    torch.manual_seed(0)
    transformer = diffusers.Flux2Transformer2DModel(
        in_channels=128,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 4, 4, 4),
        timestep_guidance_channels=32,
    ).eval()
    pipe = diffusers.Flux2Pipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=diffusers.AutoencoderKLFlux2.from_pretrained(d, torch_dtype=torch.float32).eval(),
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    embeds = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    reference = Image.fromarray((np.random.default_rng(0).random((64, 80, 3)) * 255).astype(np.uint8))

    def run(image=None):
        out = pipe(
            prompt_embeds=embeds,
            image=image,
            height=64,
            width=80,
            num_inference_steps=2,
            guidance_scale=2.0,
            generator=torch.Generator().manual_seed(0),
            output_type="np",
        ).images
        return np.asarray(out)

    ref, ref_edit = run(), run([reference])
    pipe.vae = wd.AutoencoderKLFlux2.from_pretrained(d, torch_dtype=torch.float32)
    got, got_edit = run(), run([reference])
    assert got.shape == ref.shape == (1, 64, 80, 3) and ref.std() > 0.05
    assert float(np.abs(ref_edit - ref).max()) > 1e-3  # the reference image changes the result
    err, err_edit = float(np.abs(got - ref).max()), float(np.abs(got_edit - ref_edit).max())
    print(f"Flux2Pipeline: images max abs {err:.2e}, with a reference image {err_edit:.2e}")
    for a, b in ((got, ref), (got_edit, ref_edit)):
        assert np.abs(np.round(a * 255) - np.round(b * 255)).max() <= 1


def test_encode_takes_diffusers_range_without_hints(shared):
    """diffusers' encode takes [-1, 1]: a bright image (all values ≥ 0) gets no [0, 1] hint; values
    outside [-1, 1] are still an error."""
    import warnings

    vae = wd.AutoencoderKL.from_pretrained(shared / "golden" / "aekl-tiny-sd", precision="f32")
    bright = np.full((1, 3, 16, 16), 0.5, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = vae.encode(bright).latent_dist
    assert dist.mean.shape == (1, 4, 2, 2)
    with pytest.raises(ValueError, match="outside value_range"):
        vae.encode(bright * 4)


def test_qwenimage_pipeline_with_wgvae_vae_gives_diffusers_images(shared, torch_diffusers):
    """A tiny random QwenImagePipeline (prompt embeddings given) with the qwenimage-tiny VAE."""
    pytest.importorskip("transformers", reason="SKIPPED: diffusers pipelines need transformers")
    torch, diffusers = torch_diffusers
    d = shared / "golden" / "qwenimage-tiny"
    torch.manual_seed(0)
    transformer = diffusers.QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
    ).eval()
    pipe = diffusers.QwenImagePipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=diffusers.AutoencoderKLQwenImage.from_pretrained(d, torch_dtype=torch.float32).eval(),
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    embeds = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))

    def run(output_type):
        out = pipe(
            prompt_embeds=embeds,
            prompt_embeds_mask=torch.ones(1, 8, dtype=torch.long),
            true_cfg_scale=1.0,
            height=64,
            width=80,
            num_inference_steps=2,
            generator=torch.Generator().manual_seed(0),
            output_type=output_type,
        ).images
        return np.stack([np.asarray(i) for i in out]) if output_type == "pil" else np.asarray(out)

    ref_pil, ref_np = run("pil"), run("np")
    pipe.vae = wd.AutoencoderKLQwenImage.from_pretrained(d, torch_dtype=torch.float32)
    got_pil, got_np = run("pil"), run("np")
    assert got_pil.shape == ref_pil.shape == (1, 64, 80, 3) and ref_pil.std() > 10
    diff = np.abs(got_pil.astype(int) - ref_pil.astype(int))
    err_np = float(np.abs(got_np - ref_np).max())
    print(f"QwenImagePipeline: pil max {diff.max()}, np max abs {err_np:.2e}")
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
    assert np.abs(np.round(got_np * 255) - np.round(ref_np * 255)).max() <= 1


@pytest.mark.parametrize(
    "cls, name",
    [("AutoencoderKLWan", "wan22-tiny"), ("AutoencoderKLHunyuanVideo15", "hunyuanvideo15-tiny"),
     ("AutoencoderKLLTX2Video", "ltx2-tiny"), ("AutoencoderKLMiniMaxH3", "minimax-h3-tiny")],
)
def test_2026_video_classes_decode_like_diffusers(shared, cls, name):
    d = shared / "golden" / name
    vae = getattr(wd, cls).from_pretrained(d, precision="f32")
    got = vae.decode(np.load(d / "z.npy")).sample
    want = np.load(d / "decoded.npy")
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4
    with pytest.raises(NotImplementedError, match="decode works"):
        vae.encode(np.zeros((1, 3, 1, 16, 16), np.float32))


def test_minimax_h3_tiles_as_diffusers_ships_it(shared):
    d = shared / "golden" / "minimax-h3-tiny"
    vae = wd.AutoencoderKLMiniMaxH3.from_pretrained(d, precision="f32")
    assert vae.use_tiling  # diffusers ships it with tiling on
    z = np.random.default_rng(0).standard_normal((1, 8, 3, 20, 20)).astype(np.float32)
    tiled = vae.decode(z).sample
    assert tiled.shape == (1, 3, 9, 320, 320)
    vae.disable_tiling()
    untiled = vae.decode(z).sample
    # Tiles decode independently: the reference's output differs from the untiled one.
    assert np.abs(tiled - untiled).max() > 1e-3
    small = z[:, :, :, :16, :16]
    vae.enable_tiling()
    a = vae.decode(small).sample
    vae.disable_tiling()
    assert np.array_equal(a, vae.decode(small).sample)  # one tile covers 256 px
