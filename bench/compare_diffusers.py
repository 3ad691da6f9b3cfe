#!/usr/bin/env python3
"""Time diffusers' AutoencoderKL decode against wgvae on the same machine.

Optional and never run by CI: needs `pip install torch diffusers numpy` and a
built wgvae (`cargo build --release`). Both decode seeded random latents with
the same preset architecture (random weights: timing only), at the same size
and storage dtype, untiled, warm: one warm-up then the median of --runs in one
process each (wgvae through `wgvae bench decode --tile off --dtypes ...`). The
ratio printed is wgvae's time over diffusers'.

    python3 bench/compare_diffusers.py --preset sd15 --size 256 --device cpu
    python3 bench/compare_diffusers.py --preset flux1 --size 1024 --device cuda --dtype float16
"""
import argparse
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


def make_vae(preset):
    """diffusers' AutoencoderKL with a preset's architecture (random weights), on the CPU."""
    from diffusers import AutoencoderKL

    cfg = PRESETS[preset]
    return AutoencoderKL(
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
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="sd15")
    ap.add_argument("--size", type=int, default=256, help="output pixels per side (multiple of 8)")
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--wgvae", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "wgvae"))
    ap.add_argument("--json", help="also write both medians and the ratio to this JSON file (bench/gpu/run.sh)")
    args = ap.parse_args()

    import numpy as np
    import torch

    cfg = PRESETS[args.preset]
    vae = make_vae(args.preset).to(args.device, getattr(torch, args.dtype)).eval()

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

    # Same warm-up and run count as above, in one process (pipelines compiled
    # once, as torch's kernels are loaded once), same storage dtype, untiled.
    wgvae_dtype = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[args.dtype]
    with tempfile.TemporaryDirectory() as d:
        cmd = [args.wgvae, "bench", "decode", "--vae", f"preset:{args.preset}",
               "--sizes", str(args.size), "--dtypes", wgvae_dtype, "--batch", "1",
               "--warmup", "1", "--runs", str(args.runs), "--tile", "off", "--out", d]
        print("$", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        meta, rows = {}, []
        with open(os.path.join(d, "decode.csv")) as f:
            for line in f:
                if line.startswith("# "):
                    k, _, v = line[2:].partition(": ")
                    meta[k] = v.strip()
                elif line.strip():
                    rows.append(line.strip().split(","))
    header, row = rows[0], dict(zip(rows[0], rows[1]))
    assert len(rows[1]) == len(header), "decode.csv row does not match its header"
    if row["status"].strip('"') != "ok":
        sys.exit(f"wgvae could not run this cell: {row['status']}")
    wgvae_ms = float(row["median_ms"])
    print(f"diffusers {args.preset} {args.size}² {args.dtype} on {args.device}: {torch_ms:.1f} ms "
          f"(median of {args.runs} after 1 warm-up; latents and output stay on the device)")
    print(f"wgvae     {args.preset} {args.size}² {row['dtype']} ({row['tiling']}) on {meta.get('adapter')} "
          f"({meta.get('backend')}): {wgvae_ms:.1f} ms (median of {row['runs']} after 1 warm-up; "
          f"upload + decode + RGBA8 readback)")
    print(f"ratio wgvae / diffusers: {wgvae_ms / torch_ms:.2f}")
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(dict(preset=args.preset, size=args.size, dtype=args.dtype, device=args.device,
                           diffusers_ms=torch_ms, wgvae_ms=wgvae_ms, ratio=wgvae_ms / torch_ms,
                           adapter=meta.get("adapter"), backend=meta.get("backend"),
                           tiling=row["tiling"]), f)


if __name__ == "__main__":
    sys.exit(main())
