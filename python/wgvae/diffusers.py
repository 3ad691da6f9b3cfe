"""Drop-in replacements for diffusers' VAE classes, decoding with wgvae.

``pipe.vae = wgvae.diffusers.AutoencoderKL.from_pretrained(folder_or_hub_id, subfolder="vae")``
makes a diffusers pipeline decode (and encode) on wgvae's device. Classes:
:class:`AutoencoderKL`, :class:`AutoencoderKLFlux2`, :class:`AutoencoderKLQwenImage`
and :class:`AutoencoderKLQwenImage21` (decode only; 2.1's images are RGBA, 4 channels, as
diffusers'), :class:`AutoencoderKLWan` (Wan 2.1 and 2.2, decode only),
:class:`AutoencoderKLHunyuanVideo15`, :class:`AutoencoderKLLTX2Video` and
:class:`AutoencoderKLMiniMaxH3` (decode only) and
:class:`AutoencoderTiny`. They take what diffusers' own take and give what they give:

- ``decode(z, return_dict=True)``: *raw* latents, exactly as diffusers' VAE
  (the pipeline has already divided by ``scaling_factor``, added the shift or
  un-normalised Wan latents); returns a :class:`DecoderOutput` whose
  ``.sample`` is a torch tensor on ``z``'s device and dtype (a numpy array for
  numpy input, which is how it works without torch).
- ``encode(x, return_dict=True).latent_dist``: a
  :class:`DiagonalGaussianDistribution` (``.mean``, ``.std``, ``.var``,
  ``.logvar``, ``.mode()``, ``.sample(generator)``, which draws ε with torch as
  diffusers does, so the same generator gives the same sample).
- ``.config`` (read-only, attribute access, diffusers' defaults for missing
  keys), ``.dtype``, ``.device``, ``.to()``, ``enable_tiling()`` /
  ``disable_tiling()`` / ``enable_slicing()`` / ``disable_slicing()``.

With torch installed the classes are ``torch.nn.Module``\\ s without
parameters, so pipelines move and list them as their own VAE
(``pipe.to(...)`` only records the device and dtype: wgvae runs on its own
wgpu device; tensors cross through host memory). Tiling: disabled (the
default) decodes untiled when the image fits wgvae's memory budget and in
exact tiles (equal to the untiled decode up to rounding) when it does not;
``enable_tiling()`` gives diffusers' own blended tiles (``tile="fast"`` at
``tile_sample_min_size`` with a quarter overlap), seams included, for
AutoencoderKL / FLUX.2 (Qwen-Image and AutoencoderTiny tile exactly, Wan not
at all). Precision: ``torch_dtype`` float32 / float16 / bfloat16 picks
wgvae's f32 / f16 / bf16; None leaves wgvae's ``"auto"`` (``.dtype`` then
reads float32); ``precision=`` overrides.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import Vae

try:  # torch is optional: without it the classes take and give numpy arrays.
    import torch

    _Module: Any = torch.nn.Module
except ImportError:  # pragma: no cover - exercised where torch is absent
    torch = None
    _Module = object

__all__ = [
    "AutoencoderKLHunyuanVideo15",
    "AutoencoderKLLTX2Video",
    "AutoencoderKLMiniMaxH3",
    "AutoencoderKL",
    "AutoencoderKLFlux2",
    "AutoencoderKLQwenImage",
    "AutoencoderKLQwenImage21",
    "AutoencoderKLWan",
    "AutoencoderTiny",
    "DecoderOutput",
    "AutoencoderTinyOutput",
    "AutoencoderKLOutput",
    "DiagonalGaussianDistribution",
    "FrozenConfig",
]

# The released Wan 2.1 / Qwen-Image latent statistics (diffusers' defaults).
_WAN_MEAN = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
]  # fmt: skip
_WAN_STD = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916,
]  # fmt: skip

_WEIGHTS = "diffusion_pytorch_model.safetensors"
_PRECISION = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}


class FrozenConfig(dict):
    """A model's config.json as diffusers' ``FrozenDict``: a read-only dict
    whose keys are attributes too (``vae.config.scaling_factor``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no {name!r}") from None

    def _frozen(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the config is read-only (as diffusers' FrozenDict); load another folder to change it")

    __setitem__ = __delitem__ = __setattr__ = __delattr__ = _frozen  # type: ignore[assignment]
    pop = popitem = clear = update = setdefault = _frozen  # type: ignore[assignment]


class _Output:
    """diffusers' ``BaseOutput`` in small: attribute, key and index access
    (``out.sample``, ``out["sample"]``, ``out[0]``), ``to_tuple()``."""

    _fields: Tuple[str, ...] = ()

    def __init__(self, *values: Any) -> None:
        for name, value in zip(self._fields, values):
            setattr(self, name, value)

    def to_tuple(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self._fields)

    def __getitem__(self, key: Any) -> Any:
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.to_tuple())

    def __len__(self) -> int:
        return len(self._fields)

    def keys(self) -> Tuple[str, ...]:
        return self._fields


class DecoderOutput(_Output):
    """``.sample``: the decoded images (N×3×H×W; video VAEs N×3×T×H×W)."""

    _fields = ("sample",)


class AutoencoderKLOutput(_Output):
    """``.latent_dist``: the encoder's :class:`DiagonalGaussianDistribution`."""

    _fields = ("latent_dist",)


class DiagonalGaussianDistribution:
    """The encoder's distribution, as diffusers' class of that name: ``mean``
    and ``std`` come from wgvae (``std = exp(0.5 · clamp(logvar, −30, 20))``),
    ``var = std²``, ``logvar = 2 · log(std)``. Tensors (or numpy arrays without
    torch) on the input's device and dtype."""

    def __init__(self, mean: Any, std: Any) -> None:
        self.mean = mean
        self.std = std
        self.var = std * std
        self.logvar = 2 * (std.log() if _is_tensor(std) else np.log(std))
        self.deterministic = False

    def mode(self) -> Any:
        return self.mean

    def sample(self, generator: Any = None) -> Any:
        """``mean + std · ε``. With torch, ε is diffusers' ``randn_tensor(mean.shape,
        generator, device, dtype)`` (a list of generators draws per image), so a
        generator seeded as for diffusers gives its sample. Without torch:
        ``generator`` is a ``numpy.random.Generator`` or a seed."""
        if _is_tensor(self.mean):
            eps = _randn(tuple(self.mean.shape), generator, self.mean.device, self.mean.dtype)
        else:
            rng = generator if isinstance(generator, np.random.Generator) else np.random.default_rng(generator)
            eps = rng.standard_normal(self.mean.shape).astype(self.mean.dtype)
        return self.mean + self.std * eps


def _randn(shape: Tuple[int, ...], generator: Any, device: Any, dtype: Any) -> Any:
    try:  # diffusers' own helper: the same draws as its DiagonalGaussianDistribution
        from diffusers.utils.torch_utils import randn_tensor
    except ImportError:
        randn_tensor = None
    if randn_tensor is not None:
        return randn_tensor(shape, generator=generator, device=device, dtype=dtype)
    if isinstance(generator, list):
        return torch.cat([torch.randn((1,) + shape[1:], generator=g, dtype=dtype) for g in generator]).to(device)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    return torch.randn(shape, generator=generator, device=gen_device, dtype=dtype).to(device)


def _is_tensor(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _resolve(path: Any, subfolder: Optional[str], cache_dir: Any, revision: Optional[str]) -> str:
    """A local folder (joined with ``subfolder``), or a Hub id fetched (or found
    in the cache, offline) by ``huggingface_hub``."""
    path = os.fspath(path)
    if os.path.exists(path):
        folder = os.path.join(path, subfolder) if subfolder else path
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"{folder}: not a folder; from_pretrained takes a diffusers model folder (config.json + "
                "diffusion_pytorch_model.safetensors) or a Hub id; load single files with wgvae.Vae(path)"
            )
        return folder
    if path.count("/") != 1 or path.startswith((".", "/")):
        raise FileNotFoundError(f"{path}: no such folder, and not a Hub id (owner/name)")
    try:
        from huggingface_hub import snapshot_download
    except ModuleNotFoundError as e:
        if e.name != "huggingface_hub":
            raise
        raise FileNotFoundError(
            f"{path}: no such folder; to fetch it as a Hub id install huggingface_hub (pip install huggingface_hub)"
        ) from None
    # The files wgvae reads (not the fp16 / other variants beside them).
    files = ("config.json", _WEIGHTS)
    patterns = [f"{subfolder}/{f}" if subfolder else f for f in files]
    root = snapshot_download(path, allow_patterns=patterns, cache_dir=cache_dir, revision=revision)
    folder = os.path.join(root, subfolder) if subfolder else root
    if not os.path.isfile(os.path.join(folder, "config.json")):
        want = os.path.join(subfolder or "", "config.json")
        raise FileNotFoundError(f"{path}: the Hub snapshot {root} has no {want}")
    return folder


class _WgvaeVae(_Module):  # type: ignore[misc]
    """The shared part of the drop-in classes (see the module's docstring)."""

    _defaults: Dict[str, Any] = {}
    _classes: Tuple[str, ...] = ()
    _encodes = True

    def __init__(self, vae: Vae, config: Dict[str, Any], torch_dtype: Any = None) -> None:
        super().__init__()
        self._vae = vae
        full = dict(self._defaults)
        full.update(config)
        self._config = FrozenConfig(full)
        self._dtype = torch_dtype if torch_dtype is not None else (torch.float32 if torch is not None else np.float32)
        self._device = torch.device("cpu") if torch is not None else "cpu"
        self.use_tiling = False
        self.use_slicing = False
        sample_size = full.get("sample_size") or 512
        self.tile_sample_min_size = int(sample_size[0] if isinstance(sample_size, (list, tuple)) else sample_size)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: Any,
        subfolder: Optional[str] = None,
        torch_dtype: Any = None,
        *,
        precision: Optional[str] = None,
        adapter: Any = None,
        max_memory: Any = None,
        cache_dir: Any = None,
        revision: Optional[str] = None,
        **kwargs: Any,
    ) -> "_WgvaeVae":
        """Loads a diffusers VAE folder (``subfolder="vae"`` inside a pipeline
        folder) or a Hub id through ``huggingface_hub`` (its cache; offline with
        ``HF_HUB_OFFLINE=1``). ``precision`` (wgvae's ``dtype``: ``"f32"``,
        ``"f16"``, ``"bf16"``, ``"auto"``), ``adapter`` and ``max_memory`` are
        :class:`wgvae.Vae`'s; other diffusers arguments are ignored with a
        warning."""
        if kwargs:
            warnings.warn(
                f"wgvae.diffusers.{cls.__name__}.from_pretrained ignores {sorted(kwargs)}", stacklevel=2
            )
        folder = _resolve(pretrained_model_name_or_path, subfolder, cache_dir, revision)
        config_path = os.path.join(folder, "config.json")
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"{folder}: no config.json (expected a diffusers {cls.__name__} folder)")
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        found = config.get("_class_name")
        if found and found not in cls._classes:
            raise ValueError(
                f"{folder}: config.json is a {found}, not a {cls.__name__}; load it with "
                f"wgvae.diffusers.{_CLASS_FOR.get(found, 'the matching class')}"
            )
        if precision is None:
            precision = "auto" if torch_dtype is None else _PRECISION.get(str(torch_dtype))
            if precision is None:
                raise ValueError(f"torch_dtype {torch_dtype}: expected torch.float32, torch.float16 or torch.bfloat16")
        vae = cls._load(folder, precision, adapter, max_memory)
        model = cls(vae, config, torch_dtype)
        model._attach(folder)
        return model

    def _attach(self, folder: str) -> None:
        """Reads what else a class needs from its folder (FLUX.2: the BatchNorm statistics)."""

    @classmethod
    def _load(cls, folder: str, precision: str, adapter: Any, max_memory: Any) -> Vae:
        return Vae(folder, dtype=precision, adapter=adapter, max_memory=max_memory)

    @property
    def config(self) -> FrozenConfig:
        return self._config

    @property
    def dtype(self) -> Any:
        """The dtype pipelines cast latents to (``torch_dtype``, default float32)."""
        return self._dtype

    @property
    def device(self) -> Any:
        """The device pipelines put latents on; outputs follow the input's device."""
        return self._device

    @property
    def wgvae(self) -> Vae:
        """The :class:`wgvae.Vae` underneath (its device, name, ``memory()``...)."""
        return self._vae

    def to(self, *args: Any, **kwargs: Any) -> "_WgvaeVae":
        """Records a device and / or dtype (as ``nn.Module.to`` takes them) and
        returns self; wgvae keeps running on its own device and precision."""
        for a in list(args) + [kwargs.get("device"), kwargs.get("dtype")]:
            if a is None:
                continue
            if torch is not None and isinstance(a, torch.dtype):
                self._dtype = a
            elif torch is not None and isinstance(a, torch.Tensor):
                self._device, self._dtype = a.device, a.dtype
            else:
                self._device = torch.device(a) if torch is not None else a
        return self

    def cpu(self) -> "_WgvaeVae":
        return self.to("cpu")

    def cuda(self, device: Any = None) -> "_WgvaeVae":
        return self.to("cuda" if device is None else device)

    def enable_tiling(self, tile_sample_min_size: Optional[int] = None, **ignored: Any) -> None:
        """diffusers' blended tiles (wgvae ``tile="fast"``)."""
        self.use_tiling = True
        if tile_sample_min_size is not None:
            self.tile_sample_min_size = int(tile_sample_min_size)

    def disable_tiling(self) -> None:
        """Back to wgvae's ``tile="auto"``: untiled when it fits, else exact tiles."""
        self.use_tiling = False

    def enable_slicing(self) -> None:
        """Decode and encode a batch one image at a time."""
        self.use_slicing = True

    def disable_slicing(self) -> None:
        self.use_slicing = False

    def _tile(self) -> Dict[str, Any]:
        return {"tile": "fast", "tile_size": self.tile_sample_min_size} if self.use_tiling else {"tile": "auto"}

    def forward(
        self, sample: Any, sample_posterior: bool = False, return_dict: bool = True, generator: Any = None
    ) -> Any:
        """Encode then decode, as diffusers' ``forward``."""
        posterior = self.encode(sample).latent_dist
        z = posterior.sample(generator=generator) if sample_posterior else posterior.mode()
        dec = self.decode(z).sample
        return DecoderOutput(dec) if return_dict else (dec,)

    if torch is None:

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self.forward(*args, **kwargs)

    def decode(self, z: Any, return_dict: bool = True, generator: Any = None) -> Any:
        """Raw latents ``z`` → :class:`DecoderOutput` (``.sample``) or ``(sample,)``.
        ``generator`` is accepted (pipelines pass it) and unused, as in diffusers."""
        batch = [z[i : i + 1] for i in range(z.shape[0])] if self.use_slicing and z.shape[0] > 1 else [z]
        parts = [self._decode(_as_numpy(b)) for b in batch]
        out = _like(np.concatenate(parts) if len(parts) > 1 else parts[0], z)
        return DecoderOutput(out) if return_dict else (out,)

    def encode(self, x: Any, return_dict: bool = True) -> Any:
        """Images N×3×H×W in [-1, 1] → :class:`AutoencoderKLOutput` (``.latent_dist``)."""
        if not self._encodes:
            raise NotImplementedError(self._no_encoder)
        a = _as_numpy(x)
        batch = [a[i : i + 1] for i in range(a.shape[0])] if self.use_slicing and a.shape[0] > 1 else [a]
        with _diffusers_range():
            moments = [self._vae.encode_moments(b, **self._tile()) for b in batch]
        mean = np.concatenate([m for m, _ in moments])
        std = np.concatenate([s for _, s in moments])
        dist = DiagonalGaussianDistribution(_like(mean, x), _like(std, x))
        return AutoencoderKLOutput(dist) if return_dict else (dist,)

    def _decode(self, z: np.ndarray) -> np.ndarray:
        return self._vae.decode(z, raw_latents=True, output="float", **self._tile())

    _no_encoder = ""

    def __repr__(self) -> str:
        return f"wgvae.diffusers.{type(self).__name__}({self._vae.name!r}, device={self._vae.device!r})"


@contextlib.contextmanager
def _diffusers_range() -> Iterator[None]:
    """Silences wgvae.Vae.encode's hint that [0, 1] images may be meant: diffusers'
    ``encode`` takes [-1, 1] by definition (a bright image lies in [0, 1] too)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="images: every float value lies in")
        yield


def _as_numpy(x: Any) -> np.ndarray:
    if _is_tensor(x):
        t = x.detach()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16
            t = t.float()
        return t.cpu().numpy()
    return np.asarray(x)


def _like(a: np.ndarray, ref: Any) -> Any:
    """``a`` as a tensor on ``ref``'s device and dtype when ``ref`` is a tensor, else numpy in ``ref``'s float dtype."""
    if _is_tensor(ref):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=ref.device, dtype=ref.dtype)
    dtype = getattr(ref, "dtype", np.float32)
    return a.astype(dtype if np.issubdtype(dtype, np.floating) else np.float32, copy=False)


class AutoencoderKL(_WgvaeVae):
    """diffusers' ``AutoencoderKL`` (SD 1.x, SDXL, SD3, FLUX.1 VAEs): decode and encode."""

    _classes = ("AutoencoderKL",)
    _defaults = {
        "in_channels": 3, "out_channels": 3, "block_out_channels": [64], "layers_per_block": 1,
        "act_fn": "silu", "latent_channels": 4, "norm_num_groups": 32, "sample_size": 32,
        "scaling_factor": 0.18215, "shift_factor": None, "latents_mean": None, "latents_std": None,
        "force_upcast": True, "use_quant_conv": True, "use_post_quant_conv": True,
        "mid_block_add_attention": True,
    }  # fmt: skip


class AutoencoderKLFlux2(_WgvaeVae):
    """diffusers' ``AutoencoderKLFlux2``: decode and encode raw z N×32×h×w; ``.bn``
    holds the latent BatchNorm's ``running_mean`` / ``running_var`` the FLUX.2
    pipeline reads."""

    _classes = ("AutoencoderKLFlux2",)
    _defaults = {
        "in_channels": 3, "out_channels": 3, "block_out_channels": [128, 256, 512, 512],
        "layers_per_block": 2, "act_fn": "silu", "latent_channels": 32, "norm_num_groups": 32,
        "sample_size": 1024, "force_upcast": True, "use_quant_conv": True, "use_post_quant_conv": True,
        "mid_block_add_attention": True, "batch_norm_eps": 1e-4, "batch_norm_momentum": 0.1,
        "patch_size": [2, 2],
    }  # fmt: skip

    def _attach(self, folder: str) -> None:
        stats = _read_safetensors(folder, ("bn.running_mean", "bn.running_var"))
        # Statistics missing from the file stay at BatchNorm's initial values, as in diffusers.
        n = int(np.prod(self.config.patch_size)) * int(self.config.latent_channels)
        mean = stats.get("bn.running_mean", np.zeros(n, np.float32))
        self.bn = _BatchNormStats(mean, stats.get("bn.running_var", np.ones(n, np.float32)))


class _BatchNormStats:
    """The FLUX.2 latent BatchNorm's statistics as the pipeline reads them (``vae.bn.running_mean``)."""

    def __init__(self, mean: np.ndarray, var: np.ndarray) -> None:
        self.running_mean = torch.from_numpy(mean) if torch is not None else mean
        self.running_var = torch.from_numpy(var) if torch is not None else var


def _read_safetensors(folder: str, keys: Tuple[str, ...]) -> Dict[str, np.ndarray]:
    """``keys`` (F32 / F16 / BF16) from the folder's weights file (the one wgvae
    loads), read with the format's JSON header (no safetensors package needed)."""
    out: Dict[str, np.ndarray] = {}
    path = os.path.join(folder, _WEIGHTS)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            (n,) = np.frombuffer(f.read(8), "<u8")
            header = json.loads(f.read(int(n)))
            base = 8 + int(n)
            for k in keys:
                if k not in header or k in out:
                    continue
                meta = header[k]
                start, end = meta["data_offsets"]
                f.seek(base + start)
                raw = f.read(end - start)
                if meta["dtype"] == "BF16":
                    a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
                else:
                    a = np.frombuffer(raw, {"F32": "<f4", "F16": "<f2", "F64": "<f8"}[meta["dtype"]])
                out[k] = a.astype(np.float32).reshape(meta["shape"])
    return out


class AutoencoderKLQwenImage(_WgvaeVae):
    """diffusers' ``AutoencoderKLQwenImage``: decodes one frame N×16×1×h×w to
    N×3×1×H×W (the pipeline takes ``[:, :, 0]``). No encoder yet."""

    _classes = ("AutoencoderKLQwenImage",)
    _encodes = False
    _no_encoder = (
        "wgvae has no Qwen-Image (Wan) encoder yet: AutoencoderKLQwenImage.decode works; "
        "encode with diffusers' own class"
    )
    _defaults = {
        "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
        "temperal_downsample": [False, True, True], "dropout": 0.0, "input_channels": 3,
        "latents_mean": _WAN_MEAN, "latents_std": _WAN_STD,
    }  # fmt: skip

    def enable_tiling(self, tile_sample_min_size: Optional[int] = None, **ignored: Any) -> None:
        """Tiles for memory: wgvae's exact tiles (seamless), not diffusers' blended ones."""
        self.use_tiling = True

    def _tile(self) -> Dict[str, Any]:
        return {"tile": "exact" if self.use_tiling else "auto"}

    def _decode(self, z: np.ndarray) -> np.ndarray:
        if z.ndim != 5 or z.shape[2] != 1:
            raise NotImplementedError(
                f"z of shape {tuple(z.shape)}: wgvae decodes {type(self).__name__} latents of one frame, "
                f"N×{self._vae.latent_channels}×1×h×w"
            )
        return self._vae.decode(z, raw_latents=True, output="float", **self._tile())[:, :, None]


class AutoencoderKLQwenImage21(AutoencoderKLQwenImage):
    """diffusers' ``AutoencoderKLQwenImage21`` (Qwen-Image 2.1): decodes one frame
    N×64×1×h×w to N×C×1×H×W (16×), C = ``out_channels`` (4: RGBA, alpha kept),
    clamped to [−1, 1]; the pipeline takes ``[:, :, 0]``. No encoder."""

    _classes = ("AutoencoderKLQwenImage21",)
    _no_encoder = (
        "wgvae has no Qwen-Image 2.1 encoder: AutoencoderKLQwenImage21.decode works; "
        "encode with diffusers' own class"
    )
    # diffusers' defaults but latents_mean / latents_std (64 values each; every
    # saved config.json holds them).
    _defaults = {
        "base_dim": 96, "decoder_base_dim": 144, "z_dim": 64, "dim_mult": [1, 2, 4, 8, 8], "num_res_blocks": 2,
        "attn_scales": [], "temperal_downsample": [False, True, True, True], "dropout": 0.0,
        "is_residual": True, "in_channels": 4, "out_channels": 4, "patch_size": None,
        "scale_factor_temporal": 8, "scale_factor_spatial": 16,
    }  # fmt: skip


class _VideoDecoderOnly(_WgvaeVae):
    """A video VAE wgvae decodes (no encoder): raw z N×C×T×h×w in, ``vae.decode(z).sample``
    out as diffusers returns it."""

    _encodes = False

    @classmethod
    def _load(cls, folder: str, precision: str, adapter: Any, max_memory: Any) -> Vae:
        if max_memory is not None:
            raise ValueError(f"{cls.__name__} decodes untiled: max_memory is not supported")
        vae = Vae(folder, dtype=precision, adapter=adapter)
        if not vae.is_video:
            raise ValueError(f"{folder}: wgvae did not load it as a video VAE ({vae.name})")
        return vae

    def _decode(self, z: np.ndarray) -> np.ndarray:
        if z.ndim != 5:
            raise ValueError(f"z: expected N×C×T×h×w latents, got shape {tuple(z.shape)}")
        return self._vae.decode_video(z, layout="ncthw", output="float", raw_latents=True)


class AutoencoderKLWan(_VideoDecoderOnly):
    """diffusers' ``AutoencoderKLWan`` (Wan 2.1 VAE, and Wan 2.2's residual one with
    ``is_residual`` / ``patch_size`` 2 / z_dim 48 from its config): decodes raw z
    N×C×T×h×w to N×3×T'×H×W (T' = 1 + 4 (T − 1)), clamped to [−1, 1] as diffusers.
    Untiled (tiling switches are accepted and change nothing). No encoder yet."""

    _classes = ("AutoencoderKLWan",)
    _no_encoder = "wgvae has no Wan encoder yet: AutoencoderKLWan.decode works; encode with diffusers' own class"
    _defaults = {
        "base_dim": 96, "decoder_base_dim": None, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
        "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
        "latents_mean": _WAN_MEAN, "latents_std": _WAN_STD, "is_residual": False, "in_channels": 3,
        "out_channels": 3, "patch_size": None, "scale_factor_temporal": 4, "scale_factor_spatial": 8,
    }  # fmt: skip


class AutoencoderKLHunyuanVideo15(_VideoDecoderOnly):
    """diffusers' ``AutoencoderKLHunyuanVideo15``: decodes raw z N×32×T×h×w to
    N×3×T'×H×W (T' = 1 + 4 (T − 1)), not clamped, as diffusers' whole-clip decode
    (wgvae streams it; the same values). No encoder yet."""

    _classes = ("AutoencoderKLHunyuanVideo15",)
    _no_encoder = "wgvae has no HunyuanVideo 1.5 encoder yet: decode works; encode with diffusers' own class"
    _defaults = {
        "in_channels": 3, "out_channels": 3, "latent_channels": 32,
        "block_out_channels": [128, 256, 512, 1024, 1024], "layers_per_block": 2,
        "spatial_compression_ratio": 16, "temporal_compression_ratio": 4,
        "downsample_match_channel": True, "upsample_match_channel": True, "scaling_factor": 1.03682,
    }  # fmt: skip


class AutoencoderKLLTX2Video(_VideoDecoderOnly):
    """diffusers' ``AutoencoderKLLTX2Video`` (the released non-causal decoder, no timestep
    conditioning): decodes raw z N×128×T×h×w to N×3×T'×H×W (T' = 1 + 8 (T − 1)), not
    clamped; each video's whole clip at once, as diffusers' untiled decode. No encoder yet."""

    _classes = ("AutoencoderKLLTX2Video",)
    _no_encoder = "wgvae has no LTX-2 encoder yet: decode works; encode with diffusers' own class"
    _defaults = {
        "in_channels": 3, "out_channels": 3, "latent_channels": 128,
        "decoder_block_out_channels": [256, 512, 1024], "decoder_layers_per_block": [5, 5, 5, 5],
        "patch_size": 4, "patch_size_t": 1, "scaling_factor": 1.0, "decoder_causal": False,
        "timestep_conditioning": False, "spatial_compression_ratio": 32, "temporal_compression_ratio": 8,
    }  # fmt: skip


class AutoencoderKLMiniMaxH3(_VideoDecoderOnly):
    """diffusers' ``AutoencoderKLMiniMaxH3`` (its ViT decoder): decodes raw z N×C×T×h×w to
    N×3×T'×H×W in ImageNet-normalised RGB, not clamped, clip by clip as diffusers' ``_decode``
    chunks it (overlapping clips cross-faded), in its 256-px tiles as diffusers ships it
    (``disable_tiling()``: untiled, as diffusers then). No encoder yet."""

    _classes = ("AutoencoderKLMiniMaxH3",)
    _no_encoder = "wgvae has no MiniMax-H3 encoder yet: decode works; encode with diffusers' own class"
    _defaults = {
        "in_channels": 3, "out_channels": 3, "latent_channels": 24,
        "block_out_channels": [128, 256, 256, 512, 512, 1024], "layers_per_block": 2,
        "spatial_downsample_factors": [2, 2, 2, 2, 1, 1], "temporal_downsample_factors": [1, 2, 2, 1, 1, 1],
        "decoder_num_layers": 36, "decoder_num_attention_heads": 32, "decoder_attention_head_dim": 64,
        "decoder_num_register_tokens": 4, "decoder_ffn_mult": 4, "decoder_rope_theta": 100.0,
        "decoder_rope_dim_ratio": 0.75, "decoder_norm_eps": 1e-5, "clip_length": 17, "token_drop": 3,
        "latents_mean": [0.0] * 24, "latents_std": [1.0] * 24,
    }  # fmt: skip

    def __init__(self, vae: Vae, config: Dict[str, Any], torch_dtype: Any = None) -> None:
        super().__init__(vae, config, torch_dtype)
        # diffusers ships this model with tiling on, in 256-px tiles.
        self.use_tiling = True
        self.tile_sample_min_size = 256

    def _decode(self, z: np.ndarray) -> np.ndarray:
        if z.ndim != 5:
            raise ValueError(f"z: expected N×C×T×h×w latents, got shape {tuple(z.shape)}")
        if self.use_tiling and self.tile_sample_min_size != 256:
            raise ValueError("wgvae tiles MiniMax-H3 in its reference's 256-px tiles only (tile_sample_min_height/width 256)")
        tile = "fast" if self.use_tiling else "off"
        return self._vae.decode_video(z, layout="ncthw", output="float", raw_latents=True, tile=tile)


class AutoencoderTinyOutput(_Output):
    """``.latents``: the tiny encoder's latents (no distribution)."""

    _fields = ("latents",)


class AutoencoderTiny(_WgvaeVae):
    """diffusers' ``AutoencoderTiny`` (TAESD family: taesd, taesdxl, taesd3, taef1): decode
    to images in [−1, 1] (wgvae's [0, 1] output · 2 − 1, as diffusers' ``DecoderTiny``),
    ``encode(x).latents``. Tiling uses wgvae's exact tiles (seamless), not diffusers'."""

    _classes = ("AutoencoderTiny",)
    _defaults = {
        "in_channels": 3, "out_channels": 3, "encoder_block_out_channels": [64, 64, 64, 64],
        "decoder_block_out_channels": [64, 64, 64, 64], "act_fn": "relu", "upsample_fn": "nearest",
        "latent_channels": 4, "upsampling_scaling_factor": 2, "num_encoder_blocks": [1, 3, 3, 3],
        "num_decoder_blocks": [3, 3, 3, 1], "latent_magnitude": 3, "latent_shift": 0.5,
        "force_upcast": False, "scaling_factor": 1.0, "shift_factor": 0.0,
    }  # fmt: skip

    def enable_tiling(self, tile_sample_min_size: Optional[int] = None, **ignored: Any) -> None:
        """Tiles for memory: wgvae's exact tiles (seamless), not diffusers' blended ones."""
        self.use_tiling = True

    def _tile(self) -> Dict[str, Any]:
        return {"tile": "exact" if self.use_tiling else "auto"}

    def _decode(self, z: np.ndarray) -> np.ndarray:
        return self._vae.decode(z, raw_latents=True, output="float", **self._tile()) * 2.0 - 1.0

    def encode(self, x: Any, return_dict: bool = True) -> Any:
        """Images N×3×H×W in [−1, 1] → :class:`AutoencoderTinyOutput` (``.latents``) or ``(latents,)``."""
        a = _as_numpy(x)
        batch = [a[i : i + 1] for i in range(a.shape[0])] if self.use_slicing and a.shape[0] > 1 else [a]
        with _diffusers_range():
            parts = [self._vae.encode(b, raw_latents=True, **self._tile()) for b in batch]
        latents = _like(np.concatenate(parts), x)
        return AutoencoderTinyOutput(latents) if return_dict else (latents,)

    def forward(self, sample: Any, return_dict: bool = True, **ignored: Any) -> Any:
        """Encode then decode (diffusers rounds the latents to 8 bits in between; this does not)."""
        dec = self.decode(self.encode(sample).latents).sample
        return DecoderOutput(dec) if return_dict else (dec,)


_CLASS_FOR = {
    "AutoencoderTiny": "AutoencoderTiny",
    "AutoencoderKL": "AutoencoderKL",
    "AutoencoderKLFlux2": "AutoencoderKLFlux2",
    "AutoencoderKLQwenImage": "AutoencoderKLQwenImage",
    "AutoencoderKLQwenImage21": "AutoencoderKLQwenImage21",
    "AutoencoderKLWan": "AutoencoderKLWan",
}
