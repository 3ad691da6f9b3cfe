"""Batch-decode latent files with Ray Data, the model loaded once per actor.

    python examples/ray_decode.py --vae VAE --out DIR [--concurrency 2] [--num-gpus 1] latents/*.npy

A dataset of latent paths → `map_batches(Decoder, concurrency=N, num_gpus=G)` → one PNG per
latent file (N×C×h×w files give NAME_0.png, NAME_1.png, …). Each actor decodes on the GPU Ray
assigned it: Vulkan, Metal and DX12 ignore CUDA_VISIBLE_DEVICES, so `adapter_for` maps Ray's GPU
id to a wgpu adapter index: by PCI bus id where NVIDIA's tools name the GPU's (`nvidia-smi`, or
/proc/driver/nvidia/gpus) and wgpu reports the adapter's (`wgvae.adapters()`' `pci_bus_id`,
Vulkan), else the id-th GPU adapter of the best backend in enumeration order. Without GPUs
(num_gpus=0) each actor takes wgvae's default adapter (a CPU adapter on a CPU-only host).
"""

import argparse
import os
import re
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np

import wgvae

# wgpu lists one device once per backend; the first backend here names it.
_BACKEND_ORDER = ["Vulkan", "Metal", "Dx12", "Gl"]


def normalize_bus_id(bus_id):
    """A PCI bus id as `domain:bus:device.function` with a 4-digit lowercase domain:
    nvidia-smi's `00000000:01:00.0` and wgpu's `0000:01:00.0` compare equal. None when
    `bus_id` is empty or not a bus id."""
    m = re.fullmatch(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\s*", bus_id or "")
    if not m:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


def parse_nvidia_smi(text):
    """`nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader` → {index or
    UUID: bus id} (CUDA_VISIBLE_DEVICES, hence Ray's GPU ids, names GPUs either way)."""
    found = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        bus = normalize_bus_id(parts[2])
        if bus:
            found[parts[0]] = bus
            found[parts[1]] = bus
    return found


def parse_proc_gpus(proc_dir):
    """/proc/driver/nvidia/gpus/BUS/information → {device minor or UUID: bus id} (the
    minor number usually equals nvidia-smi's index; nvidia-smi is asked first)."""
    found = {}
    root = Path(proc_dir)
    if not root.is_dir():
        return found
    for d in sorted(root.iterdir()):
        bus = normalize_bus_id(d.name)
        info = d / "information"
        if not bus or not info.is_file():
            continue
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Device Minor", "GPU UUID") and value.strip():
                found[value.strip()] = bus
    return found


def gpu_bus_ids(proc_dir="/proc/driver/nvidia/gpus"):
    """{Ray GPU id (index or UUID): PCI bus id} of this node's NVIDIA GPUs; {} without them."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode == 0:
            found = parse_nvidia_smi(out.stdout)
            if found:
                return found
    except (OSError, subprocess.SubprocessError):
        pass
    return parse_proc_gpus(proc_dir)


def adapter_for(gpu_ids, adapters, bus_ids=None):
    """The index into `adapters` (as `wgvae.adapters()` lists them) of the GPU Ray assigned:
    `gpu_ids` is `ray.get_gpu_ids()`, `bus_ids` what :func:`gpu_bus_ids` found. The GPU
    adapter whose `pci_bus_id` is the assigned GPU's (best backend first) when both are known;
    else the GPU adapters (not CPU ones) of the best backend that has any are numbered in
    enumeration order. None when no GPU was assigned or fewer GPU adapters exist than the
    id asks for (then wgvae picks its default)."""
    if not gpu_ids:
        return None
    bus = (bus_ids or {}).get(str(gpu_ids[0]).strip())
    if bus is None and bus_ids and re.fullmatch(r"\d+(\.0)?", str(gpu_ids[0]).strip()):
        bus = bus_ids.get(str(int(float(gpu_ids[0]))))
    if bus is not None:
        matches = [
            a
            for a in adapters
            if a.get("device_type") != "Cpu" and normalize_bus_id(a.get("pci_bus_id", "")) == bus
        ]
        if matches:
            return min(matches, key=lambda a: _rank(a["backend"]))["index"]
    gpus = [a for a in adapters if a["device_type"] != "Cpu"]
    if not gpus:
        return None
    # Each device once: the adapters of the best backend that has any (two identical GPUs
    # share a name, so names cannot tell them apart).
    best = min(_rank(a["backend"]) for a in gpus)
    devices = [a["index"] for a in gpus if _rank(a["backend"]) == best]
    try:
        i = int(float(gpu_ids[0]))
    except ValueError:  # a UUID no tool could place
        return None
    return devices[i] if 0 <= i < len(devices) else None


def _rank(backend):
    return _BACKEND_ORDER.index(backend) if backend in _BACKEND_ORDER else len(_BACKEND_ORDER)


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
        bus_ids = gpu_bus_ids() if ids else {}
        self.vae = wgvae.Vae(vae, dtype=dtype, adapter=adapter_for(ids, wgvae.adapters(), bus_ids))
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
