"""ComfyUI nodes for wgvae: decode LATENTs on any GPU wgpu runs on (Vulkan, Metal, DX12, GL).

Install: `pip install <wgvae>/python` into ComfyUI's environment, then copy or link this folder
into `ComfyUI/custom_nodes/`. Nodes (category "wgvae"):

- **wgvae Loader** (`WgvaeLoader`): a VAE path (diffusers folder, .safetensors in diffusers, LDM
  or TAE layout), dtype, adapter → `WGVAE`.
- **wgvae Decode** (`WgvaeDecode`): `LATENT` + `WGVAE`, tile mode, max memory (MiB, 0 = the
  device's default) → `IMAGE` (float32 B×H×W×3 in [0, 1]).

ComfyUI's LATENT holds the VAE's own latents (its samplers un-scale them on the way out), so
the decode node passes them as raw decoder input (`raw_latents=True`) — except FLUX.2's, which
ComfyUI keeps as 128-channel BatchNorm-normalised maps (4 × the 32 z channels): those take the
pipeline path, which un-normalises and unpatchifies them.
"""

from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
