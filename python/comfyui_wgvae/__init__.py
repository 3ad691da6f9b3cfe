"""ComfyUI nodes for wgvae: VAEs on any GPU wgpu runs on (Vulkan, Metal, DX12, GL).

Nodes (category "wgvae"): WGVAE Loader, WGVAE Decode, WGVAE Decode (Video), WGVAE Encode.
See README.md beside this file for installing and the inputs.
"""

from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
