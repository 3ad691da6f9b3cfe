"""The node classes (importable without ComfyUI; torch is used when installed)."""

import numpy as np

import wgvae

TILE_MODES = ["auto", "exact", "fast", "off"]
DTYPES = ["auto", "f32", "f16", "bf16"]


def _torch():
    try:
        import torch

        return torch
    except ImportError:
        return None


class WgvaeLoader:
    CATEGORY = "wgvae"
    RETURN_TYPES = ("WGVAE",)
    RETURN_NAMES = ("wgvae",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae_path": ("STRING", {"default": "", "multiline": False}),
                "dtype": (DTYPES, {"default": "auto"}),
            },
            "optional": {
                "adapter": ("STRING", {"default": ""}),
            },
        }

    def load(self, vae_path, dtype="auto", adapter=""):
        a = adapter.strip() if adapter else ""
        choice = int(a) if a.isdigit() else (a or None)
        return (wgvae.Vae(vae_path, dtype=dtype, adapter=choice),)


class WgvaeDecode:
    CATEGORY = "wgvae"
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "samples": ("LATENT",),
                "wgvae": ("WGVAE",),
                "tile": (TILE_MODES, {"default": "auto"}),
                "max_memory_mib": ("INT", {"default": 0, "min": 0, "max": 1 << 20, "step": 64}),
            }
        }

    def decode(self, samples, wgvae, tile="auto", max_memory_mib=0):
        latents = samples["samples"]
        max_memory = int(max_memory_mib) << 20 if max_memory_mib else None
        # ComfyUI's LATENT is the VAE's own latent: raw z, except FLUX.2's 128-channel
        # BatchNorm-normalised maps (4 × its 32 z channels), which the library un-normalises.
        raw = not (len(latents.shape) == 4 and latents.shape[1] == 4 * wgvae.latent_channels)
        rgb = wgvae.decode(latents, tile=tile, raw_latents=raw, max_memory=max_memory)
        image = rgb.astype(np.float32) / 255.0  # B×H×W×3 in [0, 1]
        torch = _torch()
        return (torch.from_numpy(image) if torch is not None else image,)


NODE_CLASS_MAPPINGS = {"WgvaeLoader": WgvaeLoader, "WgvaeDecode": WgvaeDecode}
NODE_DISPLAY_NAME_MAPPINGS = {"WgvaeLoader": "wgvae Loader", "WgvaeDecode": "wgvae Decode"}
