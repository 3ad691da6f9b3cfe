"""The node classes. They import without ComfyUI (tests): `folder_paths` and `comfy.*` are
imported when a node runs, and torch is used when installed (IMAGE/LATENT tensors), numpy
otherwise."""

import os

import numpy as np

import wgvae

CATEGORY = "wgvae"
TILE_MODES = ["auto", "exact", "fast", "off"]
DTYPES = ["auto", "f32", "f16", "bf16"]
# The `preset:NAME` models the library knows (random weights: for trying a workflow out).
PRESETS = ["preset:" + p for p in getattr(wgvae, "PRESETS", [])]
# The nodes' `wgvae` input shadows the module inside them.
Cancelled = wgvae.Cancelled


def _torch():
    try:
        import torch

        return torch
    except ImportError:
        return None


def _folder_paths():
    try:
        import folder_paths

        return folder_paths
    except ImportError:
        return None


def _numpy(x, what):
    """A LATENT's or IMAGE's tensor as float32 numpy (torch: detached, on the CPU)."""
    if type(x).__module__.split(".")[0] == "torch":
        return x.detach().float().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise ValueError(f"{what}: expected float values, got {a.dtype}")
    return a.astype(np.float32, copy=False)


def _to_comfy(a):
    """float32 numpy → what ComfyUI passes between nodes (a torch tensor when torch is there)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    torch = _torch()
    return torch.from_numpy(a) if torch is not None else a


def _diffusers_folders():
    """Diffusers VAE folders (config.json + weights) in ComfyUI's `vae` folders, by name."""
    fp = _folder_paths()
    if fp is None:
        return {}
    found = {}
    try:
        roots = fp.get_folder_paths("vae")
    except Exception:  # an old ComfyUI without the `vae` folder name
        return {}
    for root in roots:
        if not os.path.isdir(root):
            continue
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if os.path.isfile(os.path.join(path, "config.json")) or os.path.isfile(
                os.path.join(path, "vae", "config.json")
            ):
                found.setdefault(name + "/", path)
    return found


def vae_names():
    """The Loader's dropdown: ComfyUI's `vae` files, diffusers folders (`name/`), then presets."""
    fp = _folder_paths()
    files = []
    if fp is not None:
        try:
            files = list(fp.get_filename_list("vae"))
        except Exception:
            files = []
    return files + list(_diffusers_folders()) + PRESETS


def resolve_vae(name):
    """A dropdown value (or an absolute path) → (what `wgvae.Vae` loads, None), or (None, why)."""
    if not isinstance(name, str) or not name.strip():
        return None, "WGVAE Loader: no VAE chosen (vae_name is empty): pick a file from models/vae or a preset"
    name = name.strip()
    if name.startswith("preset:"):
        if name in PRESETS:
            return name, None
        return None, f"WGVAE Loader: unknown preset {name!r} (presets: {', '.join(PRESETS)})"
    folders = _diffusers_folders()
    if name in folders:
        return folders[name], None
    fp = _folder_paths()
    if fp is not None:
        path = fp.get_full_path("vae", name)
        if path:
            return path, None
    if os.path.isabs(name) and os.path.exists(name):
        return name, None
    where = ", ".join(fp.get_folder_paths("vae")) if fp is not None else "(ComfyUI's folder_paths is not loaded)"
    return None, (
        f"WGVAE Loader: {name!r} is not in ComfyUI's vae folders ({where}); put the .safetensors file "
        "(or a diffusers VAE folder with config.json) there, or choose a preset"
    )


class _Run:
    """ComfyUI's progress bar and interrupt for one run: the `progress=` callback of wgvae."""

    def __init__(self):
        try:
            import comfy.model_management as mm
        except ImportError:
            mm = None
        try:
            import comfy.utils as cu
        except ImportError:
            cu = None
        self.mm, self.cu = mm, cu
        self.bar, self.total, self.offset = None, 0, 0
        if mm is not None:  # queued after Cancel: stop before starting
            mm.throw_exception_if_processing_interrupted()

    def __call__(self, done, total, stage=""):
        done, total = done + self.offset, max(total + self.offset, self.total)
        if self.cu is not None:
            if self.bar is None or total != self.total:
                self.bar = self.cu.ProgressBar(total)
            self.bar.update_absolute(done, total)
        self.total = total
        if self.mm is not None and self.mm.processing_interrupted():
            return False  # wgvae stops at the next tile / chunk
        return None

    def done(self):
        """An untiled run reports nothing: fill the bar at the end."""
        if self.cu is not None and (self.bar is None or self.total == 0):
            self.cu.ProgressBar(1).update_absolute(1, 1)

    def stopped(self):
        """After `wgvae.Cancelled`: ComfyUI's own interrupt exception when that was the cause."""
        if self.mm is not None:
            self.mm.throw_exception_if_processing_interrupted()


def _mib(v):
    return int(v) << 20 if v else None


class WgvaeLoader:
    """Loads a VAE for the wgvae nodes: a file from ComfyUI's models/vae (as VAELoader lists them),
    a diffusers VAE folder there, or a preset (random weights)."""

    CATEGORY = CATEGORY
    RETURN_TYPES = ("WGVAE",)
    RETURN_NAMES = ("wgvae",)
    FUNCTION = "load"
    DESCRIPTION = "Loads a VAE (image or video) onto a GPU through wgpu (Vulkan, Metal, DX12)."

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae_name": (vae_names(), {"tooltip": "A file or diffusers folder in models/vae, or a preset"}),
                "dtype": (DTYPES, {"default": "auto", "tooltip": "auto: f32 on CPU adapters, 16-bit on GPUs"}),
            },
            "optional": {
                "adapter": ("STRING", {"default": "", "tooltip": "Empty: the best GPU; an index or a name substring"}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, vae_name):
        _, why = resolve_vae(vae_name)
        return True if why is None else why

    def load(self, vae_name, dtype="auto", adapter=""):
        spec, why = resolve_vae(vae_name)
        if why is not None:
            raise ValueError(why)
        a = adapter.strip() if adapter else ""
        choice = int(a) if a.isdigit() else (a or None)
        return (wgvae.Vae(spec, dtype=dtype, adapter=choice),)


def _image_vae(vae, node):
    if vae.is_video:
        raise ValueError(
            f"{node}: {vae.name} is a video VAE: decode its 5-D LATENT with WGVAE Decode (Video)"
        )


class WgvaeDecode:
    """LATENT → IMAGE as ComfyUI's VAEDecode computes it: clamp((x + 1) / 2, 0, 1), float."""

    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"
    DESCRIPTION = "Decodes a LATENT to an IMAGE, tiled when it does not fit the memory budget."

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "samples": ("LATENT",),
                "wgvae": ("WGVAE",),
                "tile": (TILE_MODES, {"default": "auto", "tooltip": "auto: untiled when it fits; exact: seamless tiles; fast: blended tiles (diffusers)"}),
                "tile_size": ("INT", {"default": 0, "min": 0, "max": 16384, "step": 8, "tooltip": "Tile side in image pixels; 0 = the largest that fits"}),
                "overlap": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 8, "tooltip": "fast tiles only: overlap in pixels; 0 = a quarter of the tile"}),
                "max_memory_mib": ("INT", {"default": 0, "min": 0, "max": 1 << 20, "step": 64, "tooltip": "Peak device memory, weights included; 0 = the device's default"}),
            }
        }

    def decode(self, samples, wgvae, tile="auto", tile_size=0, overlap=0, max_memory_mib=0):
        vae = wgvae
        _image_vae(vae, "WGVAE Decode")
        z = _numpy(samples["samples"], "LATENT")
        if z.ndim == 5:
            if z.shape[2] != 1:
                raise ValueError(
                    f"WGVAE Decode: a 5-D LATENT {tuple(z.shape)} (N×C×T×h×w) is a video: use WGVAE Decode (Video)"
                )
            z = z[:, :, 0]  # one frame (Qwen-Image)
        if z.ndim != 4:
            raise ValueError(f"WGVAE Decode: expected a LATENT N×C×h×w, got shape {tuple(z.shape)}")
        # ComfyUI's LATENT is what its VAE.decode takes: raw z, except FLUX.2's 128-channel
        # BatchNorm-normalised 2×2-patch maps, which the library un-normalises and unpatchifies.
        raw = not (vae.pipeline_channels != vae.latent_channels and z.shape[1] == vae.pipeline_channels)
        run = _Run()
        try:
            x = vae.decode(
                z,
                tile=tile,
                tile_size=tile_size or None,
                overlap=overlap or None,
                raw_latents=raw,
                output="float",
                max_memory=_mib(max_memory_mib),
                progress=run,
            )
        except Cancelled:
            run.stopped()
            raise
        run.done()
        return (_to_comfy(to_image(x, vae.output_range)),)


def to_image(x, output_range):
    """Decoder output N×3×H×W → IMAGE N×H×W×3: ComfyUI's process_output, clamp((x + 1) / 2, 0, 1)
    for [-1, 1] decoders (TAE decoders give [0, 1]: clamp(x, 0, 1)), then movedim(1, -1).
    An IMAGE is RGB, so an RGBA decoder's (Qwen-Image 2.1) alpha channel is left out."""
    x = x[:, :3]
    lo, hi = output_range
    y = (x + 1.0) / 2.0 if (lo, hi) == (-1.0, 1.0) else (x - lo) / (hi - lo)
    return np.clip(y, 0.0, 1.0).transpose(0, 2, 3, 1)


class WgvaeDecodeVideo:
    """5-D video LATENT N×C×T×h×w → IMAGE frames (N·T')×H×W×3, streamed one latent frame at a time."""

    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"
    DESCRIPTION = "Decodes a video LATENT (Wan 2.1, TAEHV) chunk by chunk to a batch of frames."

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "samples": ("LATENT",),
                "wgvae": ("WGVAE",),
                "chunk_frames": ("INT", {"default": 1, "min": 1, "max": 1024, "tooltip": "Latent frames per streamed chunk"}),
            }
        }

    def decode(self, samples, wgvae, chunk_frames=1):
        vae = wgvae
        if not vae.is_video:
            raise ValueError(f"WGVAE Decode (Video): {vae.name} is an image VAE: use WGVAE Decode")
        z = _numpy(samples["samples"], "LATENT")
        if z.ndim == 4:
            z = z[None]
        if z.ndim != 5 or z.shape[1] != vae.latent_channels:
            raise ValueError(
                f"WGVAE Decode (Video): expected a LATENT N×{vae.latent_channels}×T×h×w (ComfyUI's video layout), "
                f"got shape {tuple(z.shape)}"
            )
        n, t = z.shape[0], z.shape[2]
        step = max(1, int(chunk_frames))
        run = _Run()
        frames = []
        try:
            for i in range(n):
                run.offset = i * t
                # ComfyUI's LATENT holds the raw z (its samplers un-normalise Wan latents).
                s = vae.stream(layout="ncthw", output="float", raw_latents=True, progress=run, total=n * t - i * t)
                for j in range(0, t, step):
                    frames.append(self._frames(s.push(z[i, :, j : j + step]), vae))
                frames.append(self._frames(s.finish(), vae))
        except Cancelled:
            run.stopped()
            raise
        run.done()
        return (_to_comfy(np.concatenate(frames)),)

    @staticmethod
    def _frames(part, vae):
        """A stream's float frames (Wan 3×T'×H×W, TAEHV T'×3×H×W) → T'×H×W×3 as ComfyUI's VAEDecode."""
        if vae.layout == "ncthw":
            part = part.transpose(1, 0, 2, 3)
        return to_image(part, vae.output_range)


class WgvaeEncode:
    """IMAGE → LATENT as ComfyUI's VAEEncode gives it (raw z; FLUX.2: its 128-channel maps)."""

    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT",)
    FUNCTION = "encode"
    DESCRIPTION = "Encodes an IMAGE to a LATENT (the distribution's mean)."

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pixels": ("IMAGE",),
                "wgvae": ("WGVAE",),
                "tile": (TILE_MODES, {"default": "auto"}),
                "tile_size": ("INT", {"default": 0, "min": 0, "max": 16384, "step": 8}),
                "max_memory_mib": ("INT", {"default": 0, "min": 0, "max": 1 << 20, "step": 64}),
            }
        }

    def encode(self, pixels, wgvae, tile="auto", tile_size=0, max_memory_mib=0):
        vae = wgvae
        if vae.is_video:
            raise ValueError(f"WGVAE Encode: {vae.name} is a video VAE: the wgvae nodes encode images only")
        img = _numpy(pixels, "IMAGE")
        if img.ndim == 3:
            img = img[None]
        if img.ndim != 4 or img.shape[3] < 3:
            raise ValueError(f"WGVAE Encode: expected an IMAGE N×H×W×3, got shape {tuple(img.shape)}")
        # As ComfyUI's vae_encode_crop_pixels: a centred crop to multiples of the scale.
        f = vae.upscale * (2 if vae.pipeline_channels != vae.latent_channels else 1)
        h, w = img.shape[1] // f * f, img.shape[2] // f * f
        if h == 0 or w == 0:
            raise ValueError(f"WGVAE Encode: the IMAGE {img.shape[2]}×{img.shape[1]} is smaller than {f} pixels")
        y0, x0 = (img.shape[1] % f) // 2, (img.shape[2] % f) // 2
        img = img[:, y0 : y0 + h, x0 : x0 + w, :3]
        chw = np.clip(img, 0.0, 1.0).transpose(0, 3, 1, 2)
        run = _Run()
        try:
            z = vae.encode(
                chw,
                tile=tile,
                tile_size=tile_size or None,
                max_memory=_mib(max_memory_mib),
                value_range=(0.0, 1.0),
                # ComfyUI's LATENT is raw z; FLUX.2's is its BatchNorm-normalised 128-channel maps.
                raw_latents=vae.pipeline_channels == vae.latent_channels,
                progress=run,
            )
        except Cancelled:
            run.stopped()
            raise
        run.done()
        return ({"samples": _to_comfy(z)},)


NODE_CLASS_MAPPINGS = {
    "WgvaeLoader": WgvaeLoader,
    "WgvaeDecode": WgvaeDecode,
    "WgvaeDecodeVideo": WgvaeDecodeVideo,
    "WgvaeEncode": WgvaeEncode,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "WgvaeLoader": "WGVAE Loader",
    "WgvaeDecode": "WGVAE Decode",
    "WgvaeDecodeVideo": "WGVAE Decode (Video)",
    "WgvaeEncode": "WGVAE Encode",
}
