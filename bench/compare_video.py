#!/usr/bin/env python3
"""Time the PyTorch video decoders against `wgvae bench video` on the same machine.

Optional and never run by CI: needs `pip install torch numpy safetensors` (and
`diffusers` for a Wan VAE) and a built wgvae (`cargo build --release`). Every
peer decodes the same seeded random latents with the same weights, size,
lengths and storage dtype, warm (--warmup untimed runs, then the median of
--runs), in this one invocation:

  TAEHV file (taew2_1.safetensors, ...):
    taehv.py  TAEHV.decode_video(parallel=True)   all frames at once
    taehv.py  TAEHV.decode_video(parallel=False)  frame by frame
  A diffusers video VAE (a folder, or preset:wan21 / wan22 / hunyuanvideo15 / ltx2 /
  minimax-h3 with random weights of the public config):
    diffusers AutoencoderKLWan.decode             Wan 2.1 / 2.2: latent frame by frame (its causal cache)
    diffusers AutoencoderKLHunyuanVideo15.decode  the whole clip in one pass
    diffusers AutoencoderKLLTX2Video.decode       the whole clip in one pass (not causal)
    diffusers AutoencoderKLMiniMaxH3.decode       clip by clip, in 256-px tiles (its default; needs accelerate)
  and wgvae bench video (VideoDecoder, --chunk latent frames per chunk; LTX-2 a whole clip).

taehv.py (MIT, github.com/madebyollin/taehv) is not bundled: give --taehv-py
PATH, or have `taehv` importable; without it the taehv.py peers are skipped
with a message. Ratios are wgvae's over the peer's (below 1: wgvae faster), in
wall time and in process CPU time per frame (the ratio that other processes
sharing the cores distort least; on a CPU adapter such as lavapipe wgvae's
CPU time includes the device's work). Writes compare_video.csv and .md to
--out with wgvae's report metadata.

    python3 bench/compare_video.py --vae ../shared/golden/taew2_1-rand/taew2_1.safetensors \\
        --size 64 --latent-frames 2,4 --taehv-py /path/to/taehv.py
    python3 bench/compare_video.py --vae ../shared/golden/wan21-tiny --size 64 --latent-frames 2,4
    python3 bench/compare_video.py --vae ../shared/golden/hunyuanvideo15-tiny --size 64 --latent-frames 2,4
    python3 bench/compare_video.py --vae ../shared/golden/minimax-h3-tiny --size 64 --latent-frames 4,7
"""
import argparse
import csv
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def load_taehv_module(path):
    """taehv.py from --taehv-py, else an installed `taehv`; None (with a message) when neither."""
    if path:
        spec = importlib.util.spec_from_file_location("taehv", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    try:
        import taehv
        return taehv
    except ImportError:
        print("taehv.py not found (give --taehv-py PATH or install taehv): skipping the taehv.py peers",
              file=sys.stderr)
        return None


# The diffusers video VAEs wgvae decodes, and the public configs of its presets.
DIFFUSERS_VIDEO = ("AutoencoderKLWan", "AutoencoderKLHunyuanVideo15", "AutoencoderKLLTX2Video",
                   "AutoencoderKLMiniMaxH3")
PRESETS = {
    "preset:wan21": ("AutoencoderKLWan", {}),
    "preset:wan22": ("AutoencoderKLWan", {
        "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "is_residual": True, "in_channels": 12,
        "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4}),
    "preset:hunyuanvideo15": ("AutoencoderKLHunyuanVideo15", {}),
    "preset:ltx2": ("AutoencoderKLLTX2Video", {"decoder_causal": False}),
    "preset:minimax-h3": ("AutoencoderKLMiniMaxH3", {}),
}


def diffusers_class(spec):
    """The diffusers class of a preset or folder, None for anything else (a TAEHV file)."""
    if spec in PRESETS:
        return PRESETS[spec][0]
    cfg = os.path.join(spec, "config.json")
    if os.path.isdir(spec) and os.path.isfile(cfg):
        with open(cfg) as f:
            name = json.load(f).get("_class_name")
        return name if name in DIFFUSERS_VIDEO else None
    return None


def latent_geometry(model):
    """(latent channels, output pixels per latent pixel) of a diffusers video VAE."""
    c = model.config
    if "z_dim" in c:  # AutoencoderKLWan: 8× (2.1), 16× with patch size 2 (2.2)
        return c.z_dim, c.get("scale_factor_spatial", 8)
    # MiniMax-H3 derives its ratio from the down-sampling factors (an attribute, not a config field).
    return c.latent_channels, getattr(model, "spatial_compression_ratio", None) or c.spatial_compression_ratio


def taehv_model(mod, path, torch):
    """A TAEHV from a .safetensors file (taehv.py reads .pth by name): the
    architecture from the tensor shapes, the decoder's weights loaded."""
    from safetensors.torch import load_file

    sd = load_file(path)
    super_variant = "decoder.0.weight" in sd
    first = sd["decoder.0.weight" if super_variant else "decoder.1.weight"]
    last = max((k for k in sd if k.startswith("decoder.") and k.endswith(".weight") and k.count(".") == 2),
               key=lambda k: int(k.split(".")[1]))
    patch = int(round((sd[last].shape[0] // 3) ** 0.5))
    model = mod.TAEHV(checkpoint_path=None, patch_size=patch, latent_channels=first.shape[1],
                      arch_variant="super" if super_variant else None)
    sd = model.patch_tgrow_layers(sd)
    model.decoder.load_state_dict({k[len("decoder."):]: v for k, v in sd.items() if k.startswith("decoder.")})
    return model, first.shape[1]


def timed(fn, warmup, runs, sync, frames):
    """Median wall ms and median process CPU ms per frame over `runs` after `warmup`."""
    for _ in range(warmup):
        fn()
        sync()
    wall, cpu = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        fn()
        sync()
        wall.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e3 / frames)
    return sorted(wall)[len(wall) // 2], sorted(cpu)[len(cpu) // 2]


def run_wgvae(args, lengths):
    with tempfile.TemporaryDirectory() as d:
        cmd = [args.wgvae, "bench", "video", "--vae", args.vae, "--size", str(args.size),
               "--latent-frames", ",".join(map(str, lengths)), "--chunk", str(args.chunk),
               "--dtypes", args.dtype, "--warmup", str(args.warmup), "--runs", str(args.runs),
               "--seed", str(args.seed), "--out", d]
        print("$", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        meta, lines = {}, []
        with open(os.path.join(d, "video.csv")) as f:
            for line in f:
                if line.startswith("# "):
                    k, _, v = line[2:].partition(": ")
                    meta[k] = v.strip()
                elif line.strip():
                    lines.append(line)
    rows = list(csv.DictReader(lines))
    for r in rows:
        if r["status"] != "ok":
            sys.exit(f"wgvae could not run {r['latent_frames']} latent frames: {r['status']}")
    return meta, {int(r["latent_frames"]): r for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vae", required=True,
                    help="a TAEHV .safetensors file, a diffusers video VAE folder (Wan 2.1 / 2.2, HunyuanVideo 1.5, "
                         "LTX-2, MiniMax-H3) or preset:wan21|wan22|hunyuanvideo15|ltx2|minimax-h3")
    ap.add_argument("--size", type=int, default=64, help="output pixels per side (a multiple of the VAE's upscale)")
    ap.add_argument("--latent-frames", default="2,4", help="video lengths in latent frames, comma-separated")
    ap.add_argument("--chunk", type=int, default=1, help="wgvae's latent frames per streamed chunk")
    ap.add_argument("--dtype", default="f32", choices=sorted(TORCH_DTYPES))
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="seed of the latents (and of preset:wan21's weights)")
    ap.add_argument("--taehv-py", help="path to madebyollin/taehv's taehv.py (else `import taehv`)")
    ap.add_argument("--wgvae", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "wgvae"))
    ap.add_argument("--out", default="bench", help="folder for compare_video.csv and compare_video.md")
    args = ap.parse_args()
    lengths = [int(t) for t in args.latent_frames.split(",")]

    import numpy as np
    import torch

    dtype = getattr(torch, TORCH_DTYPES[args.dtype])
    cuda = args.device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    peers = []  # (name, layout, fn(z) -> output)
    cls_name = diffusers_class(args.vae)
    upscale = 8
    if cls_name:
        import diffusers

        cls = getattr(diffusers, cls_name)
        if args.vae in PRESETS:
            torch.manual_seed(args.seed)
            model = cls(**PRESETS[args.vae][1])
        else:
            model = cls.from_pretrained(args.vae)
        model = model.to(args.device, dtype).eval()
        channels, upscale = latent_geometry(model)
        peers.append((f"diffusers {cls_name}.decode", "ncthw", lambda z: model.decode(z).sample))
        torch_version = f"torch {torch.__version__}, diffusers {diffusers.__version__}"
    else:
        mod = load_taehv_module(args.taehv_py)
        if mod is None:
            sys.exit("no PyTorch peer to compare with")
        model, channels = taehv_model(mod, args.vae, torch)
        model = model.to(args.device, dtype).eval()
        peers.append(("taehv.py decode_video(parallel=True)", "ntchw",
                      lambda z: model.decode_video(z, parallel=True, show_progress_bar=False)))
        peers.append(("taehv.py decode_video(parallel=False)", "ntchw",
                      lambda z: model.decode_video(z, parallel=False, show_progress_bar=False)))
        torch_version = f"torch {torch.__version__}, taehv.py {getattr(mod, '__file__', '?')}"

    rng = np.random.default_rng(args.seed)
    if args.size % upscale:
        sys.exit(f"--size {args.size}: this VAE's frames are multiples of {upscale} pixels")
    l = args.size // upscale
    results = []  # (peer, T, frames, wall ms, cpu ms/frame, peak MiB)
    with torch.no_grad():
        for t in lengths:
            latents = rng.uniform(-1, 1, (1, t, channels, l, l)).astype(np.float32)
            for name, layout, fn in peers:
                z = torch.from_numpy(latents).to(args.device, dtype)
                if layout == "ncthw":
                    z = z.permute(0, 2, 1, 3, 4).contiguous()
                out = fn(z)
                frames = out.shape[2] if layout == "ncthw" else out.shape[1]
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                wall, cpu = timed(lambda: fn(z), args.warmup, args.runs, sync, frames)
                peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan")
                print(f"{name}: {t} latent frames → {frames} frames: {wall:.1f} ms, CPU {cpu:.0f} ms/frame",
                      file=sys.stderr)
                results.append((name, t, frames, wall, cpu, peak))

    meta, ours = run_wgvae(args, lengths)
    os.makedirs(args.out, exist_ok=True)
    head = "".join(f"# {k}: {v}\n" for k, v in meta.items())
    head += (f"# peers: {torch_version}, device {args.device}, {torch.get_num_threads()} threads, "
             f"dtype {TORCH_DTYPES[args.dtype]}\n")
    cols = ["peer", "latent_frames", "frames", "size", "peer_ms", "wgvae_ms", "wall_ratio_wgvae_over_peer",
            "peer_cpu_ms_per_frame", "wgvae_cpu_ms_per_frame", "cpu_ratio_wgvae_over_peer",
            "peer_peak_allocated_mib", "wgvae_peak_allocated_mib"]
    table = []
    for name, t, frames, wall, cpu, peak in results:
        r = ours[t]
        if int(r["frames"]) != frames:
            sys.exit(f"frame counts differ at {t} latent frames: {name} {frames}, wgvae {r['frames']}")
        w_ms, w_cpu = float(r["median_total_ms"]), float(r["cpu_ms_per_frame"])
        table.append([name, t, frames, args.size, f"{wall:.1f}", f"{w_ms:.1f}", f"{w_ms / wall:.3f}",
                      f"{cpu:.1f}", f"{w_cpu:.1f}", f"{w_cpu / cpu:.3f}", f"{peak:.1f}",
                      r["peak_allocated_mib"]])
    with open(os.path.join(args.out, "compare_video.csv"), "w") as f:
        f.write(head)
        f.write(",".join(cols) + "\n")
        for row in table:
            f.write(",".join(f'"{v}"' if isinstance(v, str) and "," in v else str(v) for v in row) + "\n")
    md = "# Video decode: wgvae against PyTorch\n\n" + "".join(f"- {line[2:]}\n" for line in head.splitlines())
    md += (f"\nwgvae: `bench video`, chunks of {args.chunk} latent frame(s) (a non-causal VAE: its whole clip; MiniMax-H3: clip by clip). Ratios: wgvae over the peer "
           "(below 1: wgvae faster). CPU: process CPU time per frame.\n\n")
    md += ("| peer | latent frames | frames | size | peer ms | wgvae ms | wall ratio | peer CPU ms/frame "
           "| wgvae CPU ms/frame | CPU ratio | peer peak MiB | wgvae peak allocated MiB |\n")
    md += "|" + "---|" * len(cols) + "\n"
    for row in table:
        row = list(row)
        row[3] = f"{row[3]}²"
        md += "| " + " | ".join(map(str, row)) + " |\n"
    with open(os.path.join(args.out, "compare_video.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    sys.exit(main())
