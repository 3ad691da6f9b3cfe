"""A tiny seeded diffusers AutoencoderKLQwenImage21 and its reference decodes.

Used by test_qwenimage21.py (built at test time: no golden is carried in the
project), and as a script that exports the folder in the format of ../shared's
goldens (config.json, diffusion_pytorch_model.safetensors, z.npy, latents.npy,
latents_packed.npy, decoded.npy, golden.json) for whoever maintains ../shared:

    /work/torchenv/bin/python python/tests/qwenimage21_reference.py OUT_DIR

Needs torch and diffusers >= 0.42 (AutoencoderKLQwenImage21).
"""

import json
import sys
from pathlib import Path

import numpy as np

# Five stages (16x, as the released model), every DupUp3D case: time factor
# 2 and 1, repeats 8, 4, 8 and 2; decoder_base_dim != base_dim; one
# attention in the mid block; out_channels 4 (RGBA) as released.
CONFIG = dict(
    base_dim=4,
    decoder_base_dim=8,
    z_dim=12,
    dim_mult=[1, 2, 2, 4, 4],
    num_res_blocks=1,
    temperal_downsample=[False, True, True, True],
)
# The released mid-block attention is one head of 1152 channels, past the
# attention kernel's single-pass 512 (it runs in output chunks): a width of
# 576 (72 x 8: one full chunk and a partial one) at a cost CPU torch runs in
# seconds.
WIDE_CONFIG = dict(CONFIG, decoder_base_dim=72, dim_mult=[1, 1, 1, 8, 8])
SEED = 21
LATENT_HW = (4, 6)  # even: the pipeline's _unpack_latents floors to 2 * (H // 32)


def build(out_dir: Path, seed: int = SEED, hw=LATENT_HW, config=None) -> dict:
    """Saves the model into out_dir and returns the seeded inputs and diffusers' outputs (float32 numpy)."""
    import torch
    from diffusers import AutoencoderKLQwenImage21
    from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import QwenImage21Pipeline

    config = config or CONFIG
    torch.manual_seed(seed)
    c = config["z_dim"]
    mean = [round(float(v), 4) for v in torch.randn(c) * 0.5]
    std = [round(float(v), 4) for v in 1.0 + torch.rand(c) * 2.0]
    model = AutoencoderKLQwenImage21(**config, latents_mean=mean, latents_std=std).eval()
    # The goldens' seeded init: weights ~ N(0, 1 / fan_in), gammas ~ 1 + 0.1 N(0, 1),
    # biases ~ 0.05 N(0, 1) (diffusers' own init leaves gammas at 1, biases at 0).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.ndim >= 2:
                p.copy_(torch.randn_like(p) / np.sqrt(p[0].numel()))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    h, w = hw
    H, W = 16 * h, 16 * w
    g = torch.Generator().manual_seed(seed + 1)
    latents = torch.randn(1, c, 1, h, w, generator=g)
    tokens = QwenImage21Pipeline._pack_latents(latents, 1, c, h, w)
    unpacked = QwenImage21Pipeline._unpack_latents(tokens, H, W, 16)
    assert torch.equal(unpacked, latents)
    # The pipeline's decode side, verbatim.
    latents_mean = torch.tensor(model.config.latents_mean).view(1, c, 1, 1, 1)
    latents_std = torch.tensor(model.config.latents_std).view(1, c, 1, 1, 1)
    z = latents * latents_std + latents_mean
    with torch.no_grad():
        decoded = model.decode(z).sample
    return dict(
        latents=latents.numpy(),
        latents_packed=tokens.contiguous().numpy(),
        z=z.numpy(),
        decoded=decoded.numpy(),
        size=(H, W),
        model=model,
    )


def export(out_dir: Path) -> None:
    """The golden folder (../shared format)."""
    import diffusers
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out_dir.mkdir(parents=True, exist_ok=True)
    r = build(out_dir)
    for name in ("z", "latents", "latents_packed", "decoded"):
        np.save(out_dir / f"{name}.npy", r[name].astype(np.float32))
    cfg = r["model"].config
    golden = {
        "model": f"diffusers AutoencoderKLQwenImage21 (diffusers {diffusers.__version__}, torch {torch.__version__})",
        "reference": "CPU, float32, torch.set_num_threads(1), torch.use_deterministic_algorithms(True), torch.no_grad()",
        "config": CONFIG,
        "config_note": "the constructor arguments given (plus latents_mean / latents_std); config.json holds the full config",
        "init": "seeded: weights with ndim >= 2 ~ N(0, 1 / fan_in); RMS_norm gammas ~ 1 + 0.1 N(0,1); biases ~ 0.05 N(0,1)",
        "seed": SEED,
        "files": {
            "z.npy": f"raw decoder input, float32 1 x {CONFIG['z_dim']} x 1 x h x w (NCTHW, one frame)",
            "latents.npy": "pipeline latents after _unpack_latents: z = latents * latents_std + latents_mean (QwenImage21Pipeline, f32)",
            "latents_packed.npy": "QwenImage21Pipeline._pack_latents(latents): N x (h*w) x C, token = row * w + col, feature = channel",
            "decoded.npy": "float32 N x 4 x 1 x 16h x 16w = vae.decode(z).sample (RGBA, out_channels 4), clamped to [-1, 1]",
        },
        "pipeline_decode": "latents = QwenImage21Pipeline._unpack_latents(tokens, H, W, 16); z = latents * std + mean; vae.decode(z).sample[:, :, 0]",
        "latents_mean": list(cfg.latents_mean),
        "latents_std": list(cfg.latents_std),
        "size": list(r["size"]),
    }
    (out_dir / "golden.json").write_text(json.dumps(golden, indent=1))
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    export(Path(sys.argv[1]))
