#!/usr/bin/env python3
"""Time diffusers' AutoencoderKL decode against wgvae on the same machine.

Optional and never run by CI: needs `pip install torch diffusers numpy` and a
built wgvae (`cargo build --release`). Both decode the same seeded latents
with the same preset architecture (random weights: timing only), at the same
size; the ratio printed is wgvae's time over diffusers'.

    python3 bench/compare_diffusers.py --preset sd15 --size 256 --device cpu
    python3 bench/compare_diffusers.py --preset flux1 --size 1024 --device cuda --dtype float16
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PRESETS = {
    "sd15": dict(latent_channels=4, scaling_factor=0.18215, shift_factor=None, use_quant_conv=True, use_post_quant_conv=True),
    "sdxl": dict(latent_channels=4, scaling_factor=0.13025, shift_factor=None, use_quant_conv=True, use_post_quant_conv=True),
    "sd3": dict(latent_channels=16, scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False),
    "flux1": dict(latent_channels=16, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="sd15")
    ap.add_argument("--size", type=int, default=256, help="output pixels per side (multiple of 8)")
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--wgvae", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "wgvae"))
    args = ap.parse_args()

    import numpy as np
    import torch
    from diffusers import AutoencoderKL

    cfg = PRESETS[args.preset]
    vae = AutoencoderKL(
        block_out_channels=[128, 256, 512, 512],
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        layers_per_block=2,
        norm_num_groups=32,
        latent_channels=cfg["latent_channels"],
        scaling_factor=cfg["scaling_factor"],
        shift_factor=cfg["shift_factor"],
        use_quant_conv=cfg["use_quant_conv"],
        use_post_quant_conv=cfg["use_post_quant_conv"],
    ).to(args.device, getattr(torch, args.dtype)).eval()

    l = args.size // 8
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, cfg["latent_channels"], l, l)).astype(np.float32)
    z = torch.from_numpy(latents).to(args.device, getattr(torch, args.dtype))

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    times = []
    with torch.no_grad():
        vae.decode(z)  # warm-up
        sync()
        for _ in range(args.runs):
            t = time.perf_counter()
            vae.decode(z)
            sync()
            times.append((time.perf_counter() - t) * 1e3)
    torch_ms = sorted(times)[len(times) // 2]

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "latents.npy")
        np.save(path, latents)
        ours = []
        for _ in range(args.runs):
            out = subprocess.run(
                [args.wgvae, "decode", path, "--vae", f"preset:{args.preset}", "--raw-latents",
                 "-o", os.path.join(d, "out.png"), "--json"],
                check=True, capture_output=True, text=True,
            )
            ours.append(json.loads(out.stdout)["decode_ms"])
        info = json.loads(out.stdout)
    wgvae_ms = sorted(ours)[len(ours) // 2]
    print(f"diffusers {args.preset} {args.size}² {args.dtype} on {args.device}: {torch_ms:.1f} ms (median of {args.runs})")
    print(f"wgvae     {args.preset} {args.size}² f32 on {info['adapter']} ({info['backend']}): {wgvae_ms:.1f} ms "
          f"(decode_ms: upload + decode + readback, per process)")
    print(f"ratio wgvae / diffusers: {wgvae_ms / torch_ms:.2f}")


if __name__ == "__main__":
    sys.exit(main())
