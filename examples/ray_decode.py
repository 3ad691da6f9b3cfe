"""Batch-decode latent files with Ray Data, the model loaded once per actor.

    python examples/ray_decode.py --vae VAE --out DIR [--concurrency 2] [--num-gpus 1] latents/*.npy

A dataset of latent paths → `map_batches(Decoder, concurrency=N, num_gpus=G)` → one PNG per
latent file (N×C×h×w files give NAME_0.png, NAME_1.png, …). Each actor decodes on the GPU Ray
assigned it: Vulkan, Metal and DX12 ignore CUDA_VISIBLE_DEVICES, so `adapter_for` maps Ray's GPU
id to a wgpu adapter index (the id-th GPU adapter in enumeration order, one per device). Without
GPUs (num_gpus=0) each actor takes wgvae's default adapter (a CPU adapter on a CPU-only host).
"""

import argparse
import os
import struct
import zlib
from pathlib import Path

import numpy as np

import wgvae

# wgpu lists one device once per backend; the first backend here names it.
_BACKEND_ORDER = ["Vulkan", "Metal", "Dx12", "Gl"]


def adapter_for(gpu_ids, adapters):
    """The index into `adapters` (as `wgvae.adapters()` lists them) of the GPU Ray assigned:
    `gpu_ids` is `ray.get_gpu_ids()`. GPU adapters (not CPU ones) are numbered in enumeration
    order, one per device name and the best backend; None when no GPU was assigned or fewer
    GPU adapters exist than the id asks for (then wgvae picks its default)."""
    if not gpu_ids:
        return None
    names, best = [], {}
    for a in adapters:
        if a["device_type"] == "Cpu":
            continue
        rank = _BACKEND_ORDER.index(a["backend"]) if a["backend"] in _BACKEND_ORDER else len(_BACKEND_ORDER)
        if a["name"] not in best:
            names.append(a["name"])
        if a["name"] not in best or rank < best[a["name"]][0]:
            best[a["name"]] = (rank, a["index"])
    i = int(float(gpu_ids[0]))
    return best[names[i]][1] if 0 <= i < len(names) else None


def write_png(path, rgb):
    """uint8 H×W×3 → an 8-bit RGB PNG (no Pillow needed)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    data += chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    tmp = Path(str(path) + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Decoder:
    """A Ray Data actor: loads the VAE once, decodes each batch of latent paths to PNGs."""

    def __init__(self, vae, out_dir, dtype="auto", tile="auto"):
        import ray

        ids = ray.get_gpu_ids() if ray.is_initialized() else []
        self.vae = wgvae.Vae(vae, dtype=dtype, adapter=adapter_for(ids, wgvae.adapters()))
        self.out_dir, self.tile = Path(out_dir), tile

    def __call__(self, batch):
        written = []
        for p in batch["path"]:
            images = self.vae.decode(np.load(p), tile=self.tile)
            stem = Path(p).stem
            for i, img in enumerate(images):
                name = f"{stem}.png" if len(images) == 1 else f"{stem}_{i}.png"
                write_png(self.out_dir / name, img)
                written.append(str(self.out_dir / name))
        return {"png": np.array(written, dtype=object)}


def decode_files(paths, vae, out_dir, concurrency=2, num_gpus=0, dtype="auto", tile="auto"):
    """Decodes `paths` with `concurrency` actors; returns the PNG paths written."""
    import ray

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    ds = ray.data.from_items([{"path": str(p)} for p in paths])
    ds = ds.map_batches(
        Decoder,
        fn_constructor_kwargs={"vae": str(vae), "out_dir": str(out_dir), "dtype": dtype, "tile": tile},
        batch_size=1,
        concurrency=concurrency,
        num_gpus=num_gpus,
    )
    return sorted(str(r["png"]) for r in ds.take_all())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("latents", nargs="+")
    ap.add_argument("--vae", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--num-gpus", type=float, default=0)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tile", default="auto")
    a = ap.parse_args()
    for p in decode_files(a.latents, a.vae, a.out, a.concurrency, a.num_gpus, a.dtype, a.tile):
        print(p)


if __name__ == "__main__":
    main()
