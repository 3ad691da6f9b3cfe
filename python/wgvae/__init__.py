"""wgvae: diffusion-model VAE decoding on any GPU wgpu runs on.

numpy arrays (or anything with ``__array__`` or DLPack: CPU torch tensors)
in, images out. The native module ``wgvae._wgvae`` wraps the Rust library's
front doors; this layer converts arrays and checks their layout.

Exceptions: ``ValueError`` for bad input (NaN latents, wrong shapes or
channel counts, unreadable weight files), ``MemoryError`` for a memory budget
no tiling can meet or a device out of memory, ``FileNotFoundError`` /
``OSError`` for the file system, ``RuntimeError`` for device failures. Each
carries the library's message.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _wgvae
from ._video_file import VIDEO_EXTENSIONS, find_ffmpeg, write_video

__version__: str = _wgvae.__version__
Cancelled = _wgvae.Cancelled
"""Raised when a ``progress=`` callback returned False (a subclass of RuntimeError)."""

PRESETS: List[str] = list(_wgvae.PRESETS)
"""The NAMEs of ``Vae("preset:NAME")`` (random weights)."""

Progress = Callable[[int, int, str], Optional[bool]]
"""``progress(done, total, stage)``: return False to stop the run (``Cancelled``)."""

__all__ = ["Vae", "VideoStream", "Cancelled", "PRESETS", "adapters", "write_video", "find_ffmpeg", "VIDEO_EXTENSIONS", "__version__"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}  # fmt: skip


def adapters() -> List[Dict[str, Any]]:
    """Every adapter wgpu sees: index, name, backend, device_type, driver,
    driver_info, shader_f16, vendor_id, device_id and pci_bus_id (e.g.
    ``"0000:01:00.0"``; ``""`` where the backend does not report it), in the
    order ``Vae(adapter=index)`` uses."""
    return list(_wgvae.adapters())


def _bytes(value: Union[int, str, None], what: str) -> Optional[int]:
    """Bytes as an int or a string with a K/M/G/KiB/MiB/GiB suffix (as the CLI's ``--max-memory``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected bytes (int) or a size such as '800MiB', got {value!r}")
    if isinstance(value, (int, np.integer)):
        if value <= 0:
            raise ValueError(f"{what}: expected a positive number of bytes, got {value}")
        return int(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS and float(m.group(1)) > 0:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ValueError(f"{what} {value!r}: expected bytes, e.g. 1073741824, '1GiB' or '800MiB'")


def _as_array(x: Any, what: str) -> np.ndarray:
    """A numpy view or copy of ``x``: numpy arrays, torch tensors (detached, moved
    to the CPU; bfloat16 widened), anything with ``__array__`` or ``__dlpack__``."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.split(".")[0] == "torch":
        t = x.detach()
        if str(t.dtype) == "torch.bfloat16":  # numpy has no bfloat16
            t = t.float()
        return t.cpu().numpy()
    if hasattr(x, "__array__"):
        return np.asarray(x)
    if hasattr(x, "__dlpack__") and hasattr(np, "from_dlpack"):
        return np.from_dlpack(x)
    raise ValueError(
        f"{what}: expected a numpy array, a CPU torch tensor or an object with __array__ / __dlpack__, "
        f"got {type(x).__name__}"
    )


def _float_pixels(a: np.ndarray, value_range: Tuple[float, float]) -> np.ndarray:
    """Float images in ``value_range`` as the 0..255 float pixels the engine encodes."""
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise ValueError(f"value_range must be two numbers (low, high), got {value_range!r}") from None
    if not hi > lo:
        raise ValueError(f"value_range must have low < high, got {value_range!r}")
    vmin, vmax = float(a.min()), float(a.max())
    slack = 1e-3 * (hi - lo)
    if vmin < lo - slack or vmax > hi + slack:
        hint = " (images in [0, 1]: pass value_range=(0, 1))" if vmin >= -slack and (lo, hi) != (0.0, 1.0) else ""
        raise ValueError(
            f"images: float values span [{vmin:.4g}, {vmax:.4g}], outside value_range [{lo:g}, {hi:g}]{hint}; "
            "rescale them or give their range"
        )
    if (lo, hi) == (-1.0, 1.0) and vmin >= 0.0 and vmax > 0.0:
        warnings.warn(
            "images: every float value lies in [0, 1] but is read as [-1, 1] (diffusers' convention, "
            "washed-out latents if they are [0, 1] images): pass value_range=(0, 1) for [0, 1] images",
            stacklevel=4,
        )
    scaled = (np.clip(a, lo, hi) - lo) * (255.0 / (hi - lo))
    return np.ascontiguousarray(scaled, dtype="<f4")


def _f32(a: np.ndarray, what: str) -> np.ndarray:
    if a.dtype.kind != "f":
        raise ValueError(f"{what}: expected float16, float32 or float64 values, got {a.dtype}")
    return np.ascontiguousarray(a, dtype="<f4")


class Vae:
    """A VAE decoder (and, on first ``encode``, its encoder) on a device.

    ``path_or_preset``: a diffusers folder (or a pipeline folder with ``vae/``),
    a ``.safetensors`` file in diffusers, LDM or TAE layout, or ``preset:NAME``
    (random weights). ``dtype``: ``"auto"`` (f16 for models known to fit it,
    bf16 otherwise), ``"f32"``, ``"f16"`` or ``"bf16"``. ``policy``: the memory
    pool, ``"planned"``, ``"caching"`` or ``"exact"``. ``adapter``: None (the
    best GPU), an index into :func:`adapters` or a name substring.
    ``max_memory``: the default peak device memory of a run (bytes or e.g.
    ``"2GiB"``), weights included. ``encoder``: the encoder's weights when they
    live elsewhere (TAE ``encoder.safetensors``); default ``path_or_preset``.

    Video VAEs load through the same class (``is_video`` is then True): a
    TAEHV ``.safetensors`` (taew2_1, taew2_2…), a Wan 2.1 / 2.2, HunyuanVideo
    1.5, LTX-2 or MiniMax-H3 VAE (diffusers folder or file) or
    ``preset:wan21`` / ``wan22`` / ``hunyuanvideo15`` / ``ltx2`` /
    ``minimax-h3``. They decode with
    :meth:`decode_video` (whole clips) and :meth:`stream` (chunk by chunk);
    ``decode``, ``encode`` and ``memory`` are for image VAEs.
    """

    def __init__(
        self,
        path_or_preset: Union[str, "os.PathLike[str]"],
        dtype: str = "auto",
        policy: str = "planned",
        adapter: Union[int, str, None] = None,
        max_memory: Union[int, str, None] = None,
        encoder: Union[str, "os.PathLike[str]", None] = None,
    ) -> None:
        spec = _path(path_or_preset)
        self._video = _wgvae.is_video_vae(spec)
        if self._video:
            if max_memory is not None or encoder is not None:
                raise ValueError(
                    f"{spec!r} is a video VAE: it decodes untiled and has no encoder (no max_memory / encoder)"
                )
            self._model = _wgvae.VideoModel(spec, dtype, policy, adapter)
            return
        self._model = _wgvae.Model(
            spec,
            dtype,
            policy,
            adapter,
            _bytes(max_memory, "max_memory"),
            None if encoder is None else _path(encoder),
        )

    @property
    def name(self) -> str:
        """The model's description (variant and source)."""
        return self._model.name

    @property
    def is_video(self) -> bool:
        """True for a video VAE (TAEHV, Wan): use :meth:`decode_video` / :meth:`stream`."""
        return self._video

    @property
    def layout(self) -> Optional[str]:
        """The latent layout a video VAE takes: ``"ntchw"`` (TAEHV) or
        ``"ncthw"`` (Wan, diffusers); None for an image VAE."""
        return self._model.layout if self._video else None

    @property
    def latent_channels(self) -> int:
        return self._model.latent_channels

    @property
    def image_channels(self) -> int:
        """Channels of decoded images: 3 (RGB) or 4 (RGBA: Qwen-Image 2.1,
        whose alpha :meth:`decode` keeps); video VAEs give RGB frames."""
        return 3 if self._video else self._model.image_channels

    @property
    def output_range(self) -> Tuple[float, float]:
        """The range of ``output="float"`` values: (-1, 1) (diffusers, Wan) or (0, 1) (TAE, TAEHV)."""
        return tuple(self._model.output_range)

    @property
    def pipeline_channels(self) -> int:
        """Channels of the pipeline's latent maps: 128 for FLUX.2 (4 × its 32
        z channels in 2×2 patches, BatchNorm-normalised), else :attr:`latent_channels`."""
        return self._model.latent_channels if self._video else self._model.pipeline_channels

    @property
    def upscale(self) -> int:
        """Output pixels per latent along each axis (8; 16 for taew2_2)."""
        return self._model.upscale

    @property
    def dtype(self) -> str:
        """Storage dtype of weights and activations: f32, f16 or bf16."""
        return self._model.dtype

    @property
    def device(self) -> str:
        """The adapter's name and backend."""
        return self._model.device

    @property
    def random_weights(self) -> bool:
        """True for ``preset:NAME`` models (the images show noise)."""
        return self._model.random_weights

    def __repr__(self) -> str:
        return f"wgvae.Vae({self.name!r}, dtype={self.dtype!r}, device={self.device!r})"

    def decode(
        self,
        latents: Any,
        tile: str = "auto",
        raw_latents: bool = False,
        output: str = "uint8",
        tile_size: Optional[int] = None,
        max_memory: Union[int, str, None] = None,
        size: Optional[Tuple[int, int]] = None,
        overlap: Optional[int] = None,
        progress: Optional[Progress] = None,
    ) -> np.ndarray:
        """Decodes latents N×C×h×w (or C×h×w) to images.

        ``size=(H, W)`` (image pixels) marks ``latents`` as a transformer's
        packed token sequence N×L×F, unpacked by the model's own rule: FLUX.1
        N×L×64 (2×2 patches of 16 channels), FLUX.2 N×L×128 (its normalised
        128-channel maps, one token per position). FLUX.2 pipeline latents
        N×128×h/2×w/2 are un-normalised with the VAE's BatchNorm statistics and
        unpatchified; ``raw_latents`` takes its z N×32×h×w.

        ``latents`` are pipeline latents (as ``pipe(..., output_type="latent")``
        returns them) unless ``raw_latents``: the decoder input is
        ``latents / scaling_factor + shift_factor``. ``tile``: ``"auto"``
        (untiled when it fits the memory budget), ``"off"``, ``"exact"``
        (equals the untiled decode up to rounding) or ``"fast"`` (diffusers'
        blended tiles). ``output="uint8"``: N×H×W×3 uint8 (diffusers'
        postprocessing); ``output="float"``: float32 N×3×H×W, the raw decoder
        output (diffusers' ``vae.decode(...).sample``). Models with an alpha
        channel (:attr:`image_channels` 4: Qwen-Image 2.1) give N×H×W×4 RGBA
        and N×4×H×W. A C×h×w input gives
        one image without the batch axis. The Qwen-Image VAE also takes one
        frame N×16×1×h×w (the pipeline's latents) and un-normalises pipeline
        latents per channel with the config's latents_mean / latents_std.
        ``overlap``: ``tile="fast"`` only, neighbouring tiles' overlap in image
        pixels (default a quarter of the tile).

        ``progress(done, total, stage)`` is called after every tile step of a
        tiled run (none for an untiled one), from the decoding thread with the
        GIL held; returning False stops the run at the next tile with
        :class:`Cancelled`, an exception it raises stops it and is re-raised,
        and Ctrl-C (a pending signal) stops it with KeyboardInterrupt. The Vae
        stays usable. The callback must not use this Vae.
        """
        self._image_only("decode", "decode_video")
        if output not in ("uint8", "float"):
            raise ValueError(f"output {output!r}: expected 'uint8' or 'float'")
        a = _as_array(latents, "latents")
        if size is not None:
            if a.ndim != 3:
                raise ValueError(
                    f"latents: size=(H, W) is for packed tokens N×L×F, got shape {tuple(a.shape)}"
                )
            size = (int(size[0]), int(size[1]))
            single = False
        else:
            single = a.ndim == 3
            if single:
                a = a[None]
            if a.ndim not in (4, 5):
                raise ValueError(
                    f"latents: expected N×C×h×w or C×h×w, one frame N×C×1×h×w (Qwen-Image), or tokens N×L×F with size=(H, W); got shape {tuple(a.shape)}"
                )
            # 5-D: one frame N×C×1×h×w (Qwen-Image); the library checks it.
        a = _f32(a, "latents")
        rgb, raw, h, w = self._model.decode(
            a.tobytes(),
            list(a.shape),
            tile,
            tile_size,
            bool(raw_latents),
            output == "float",
            _bytes(max_memory, "max_memory"),
            size,
            overlap,
            progress,
        )
        n, c = a.shape[0], self._model.image_channels
        if output == "float":
            out = np.frombuffer(raw, dtype="<f4").reshape(n, c, h, w)
        else:
            out = np.frombuffer(rgb, dtype=np.uint8).reshape(n, h, w, c)
        return out[0] if single else out

    def encode(
        self,
        images: Any,
        tile: str = "auto",
        raw_latents: bool = False,
        sample: Optional[int] = None,
        tile_size: Optional[int] = None,
        max_memory: Union[int, str, None] = None,
        value_range: Tuple[float, float] = (-1.0, 1.0),
        overlap: Optional[int] = None,
        progress: Optional[Progress] = None,
    ) -> np.ndarray:
        """Encodes images to latents, float32 N×C×h×w (pipeline latents unless
        ``raw_latents``; the distribution's mean unless ``sample`` seeds a draw).

        ``images``: uint8 N×H×W×3 (or H×W×3), as PIL / PNG pixels, or float
        N×3×H×W (or 3×H×W) in ``value_range``: [-1, 1] by default, as diffusers'
        image processor hands them to ``vae.encode``; ``value_range=(0, 1)`` for
        images in [0, 1] (torchvision's ``to_tensor``). Float values outside the
        range are an error, never clipped; float images that all lie in [0, 1]
        under the default range get a warning (they may be [0, 1] images). H and
        W must be multiples of 8. ``overlap`` and ``progress`` as :meth:`decode`.
        """
        single, (data, shape, _, _) = self._encode(
            images, tile, raw_latents, sample, tile_size, max_memory, value_range, overlap, progress, False
        )
        out = np.frombuffer(data, dtype="<f4").reshape(shape)
        return out[0] if single else out

    def encode_moments(
        self,
        images: Any,
        tile: str = "auto",
        tile_size: Optional[int] = None,
        max_memory: Union[int, str, None] = None,
        value_range: Tuple[float, float] = (-1.0, 1.0),
        progress: Optional[Progress] = None,
    ) -> Tuple[np.ndarray, np.ndarray]:
        """The encoder's distribution for ``images`` (as :meth:`encode` takes
        them): (mean, std), float32 N×C×h×w, raw (before the pipeline's
        scaling), as diffusers' ``vae.encode(x).latent_dist.mean`` / ``.std``;
        ``std = exp(0.5 · clamp(logvar, −30, 20))``. AutoencoderKL and FLUX.2
        only (a TAE encoder has no distribution: ``ValueError``)."""
        single, (_, shape, mean, std) = self._encode(
            images, tile, True, None, tile_size, max_memory, value_range, None, progress, True
        )
        if mean is None or std is None:
            raise ValueError(
                f"{self.name}: its encoder gives latents, not a distribution (no mean / std); use encode()"
            )
        m = np.frombuffer(mean, dtype="<f4").reshape(shape)
        s = np.frombuffer(std, dtype="<f4").reshape(shape)
        return (m[0], s[0]) if single else (m, s)

    def _encode(
        self,
        images: Any,
        tile: str,
        raw_latents: bool,
        sample: Optional[int],
        tile_size: Optional[int],
        max_memory: Union[int, str, None],
        value_range: Tuple[float, float],
        overlap: Optional[int],
        progress: Optional[Progress],
        moments: bool,
    ) -> Tuple[bool, Tuple[Any, List[int], Any, Any]]:
        """(no batch axis given, the native encode's (latents, shape, mean, std) bytes)."""
        self._image_only("encode", None)
        a = _as_array(images, "images")
        if a.dtype == np.uint8:
            single = a.ndim == 3
            if single:
                a = a[None]
            if a.ndim != 4 or a.shape[3] != 3:
                raise ValueError(f"images: uint8 images must be N×H×W×3 or H×W×3, got shape {tuple(a.shape)}")
            pixels = np.ascontiguousarray(a.transpose(0, 3, 1, 2), dtype="<f4")
        else:
            single = a.ndim == 3
            if single:
                a = a[None]
            if a.ndim != 4 or a.shape[1] != 3:
                raise ValueError(
                    f"images: float images must be N×3×H×W or 3×H×W in [-1, 1], got shape {tuple(a.shape)}"
                )
            a = _f32(a, "images")
            if not np.isfinite(a).all():
                raise ValueError("images: NaN or infinite values")
            pixels = _float_pixels(a, value_range)
        return single, self._model.encode(
            pixels.tobytes(),
            list(pixels.shape),
            tile,
            tile_size,
            bool(raw_latents),
            sample,
            _bytes(max_memory, "max_memory"),
            overlap,
            progress,
            moments,
        )

    def memory(
        self,
        size: Tuple[int, int] = (1024, 1024),
        batch: int = 1,
        dtype: Optional[str] = None,
        encode: bool = False,
        tile: str = "auto",
        tile_size: Optional[int] = None,
        max_memory: Union[int, str, None] = None,
    ) -> Dict[str, Any]:
        """Predicted memory of decoding to (or, with ``encode``, encoding) a
        ``size`` = (H, W) image batch on this model's device: the dict
        ``wgvae memory --json`` prints (a dry run; nothing is allocated)."""
        self._image_only("memory", None)
        h, w = size
        text = self._model.memory(
            int(h), int(w), int(batch), dtype, bool(encode), tile, tile_size, _bytes(max_memory, "max_memory")
        )
        return json.loads(text)


    def _image_only(self, what: str, instead: Optional[str]) -> None:
        if self._video:
            hint = f": use {instead}() or stream()" if instead else ""
            raise ValueError(f"{self.name} is a video VAE: {what}() is for image VAEs{hint}")

    def _video_only(self, what: str) -> None:
        if not self._video:
            raise ValueError(f"{self.name} is an image VAE: {what}() is for video VAEs (TAEHV, Wan); use decode()")

    def _video_layout(self, layout: Optional[str]) -> str:
        if layout is None:
            return self._model.layout
        if not isinstance(layout, str) or layout.lower() not in ("ntchw", "ncthw"):
            raise ValueError(
                f"layout {layout!r}: expected 'ntchw' (N×T×C×h×w, TAEHV) or 'ncthw' (N×C×T×h×w, diffusers/Wan)"
            )
        return layout.lower()

    def frames_for(self, latent_frames: int) -> int:
        """Frames a video of ``latent_frames`` latent frames decodes to
        (TAEHV: ``4 T - 3`` for taew2_1; Wan: ``1 + 4 (T - 1)``)."""
        self._video_only("frames_for")
        return self._model.frames_for(int(latent_frames))

    def decode_video(
        self,
        latents: Any,
        layout: Optional[str] = None,
        output: str = "uint8",
        raw_latents: bool = False,
        progress: Optional[Progress] = None,
        tile: str = "auto",
    ) -> np.ndarray:
        """Decodes a batch of videos whole.

        ``latents``: 5-D, N×T×C×h×w for TAEHV and N×C×T×h×w for Wan (the
        model's :attr:`layout`; ``layout="ntchw"`` / ``"ncthw"`` overrides),
        or 4-D for one video without the batch axis. Wan latents are pipeline
        latents (``z = latents * latents_std + latents_mean``) unless
        ``raw_latents`` (diffusers' ``AutoencoderKLWan.decode`` input).
        ``output="float"``: float32 as the CLI's ``--save-raw`` writes it:
        TAEHV N×T'×3×H×W before its [0, 1] clamp (taehv.py's
        ``decode_video``), Wan N×3×T'×H×W clamped to [-1, 1] (diffusers);
        ``output="uint8"``: N×T'×H×W×3 frames (the CLI's PNG frames).
        A 4-D input gives one video without the batch axis.
        ``progress(done, total, stage)``: the videos are decoded through
        :meth:`stream`, one latent frame per chunk, and it is called after each
        chunk (done and total count latent frames of the whole batch); False
        stops between chunks with :class:`Cancelled`.
        ``tile``: ``"auto"`` (the model's default: untiled, but MiniMax-H3 in
        its reference's 256-px tiles, as diffusers decodes it), ``"off"``
        (untiled) or ``"fast"`` (MiniMax-H3's reference tiles).
        """
        self._video_only("decode_video")
        if output not in ("uint8", "float"):
            raise ValueError(f"output {output!r}: expected 'uint8' or 'float'")
        layout = self._video_layout(layout)
        a = _as_array(latents, "latents")
        single = a.ndim == 4
        if single:
            a = a[None]
        if a.ndim != 5:
            raise ValueError(
                f"latents: video latents are 5-D ({_DESCRIBE[layout]}) or 4-D for one video, "
                f"got shape {tuple(a.shape)}"
            )
        if layout != self._model.layout:
            a = a.transpose(0, 2, 1, 3, 4)
        a = _f32(a, "latents")
        if progress is not None:
            out = self._decode_video_chunked(a, output, raw_latents, progress, tile)
            return out[0] if single else out
        data, shape = self._model.decode(a.tobytes(), list(a.shape), bool(raw_latents), output == "uint8", tile)
        dtype = np.uint8 if output == "uint8" else "<f4"
        out = np.frombuffer(data, dtype=dtype).reshape(shape)
        return out[0] if single else out

    def _decode_video_chunked(
        self, a: np.ndarray, output: str, raw_latents: bool, progress: Progress, tile: str = "auto"
    ) -> np.ndarray:
        """:meth:`decode_video` of ``a`` (the model's layout, 5-D) one latent frame at a time."""
        layout = self._model.layout
        t_axis = 2 if layout == "ncthw" else 1
        n, t = a.shape[0], a.shape[t_axis]
        # The frame axis of one video's output: Wan float 3×T'×H×W, else T' first.
        f_axis = 1 if (output == "float" and layout == "ncthw") else 0
        # A decoder that is not causal (LTX-2) takes each video's whole clip at once.
        step = t if self._model.whole_clip else 1
        videos = []
        for i in range(n):
            s = self.stream(layout, output, raw_latents, tile=tile)
            parts = []
            for j in range(0, t, step):
                chunk = a[i, :, j : j + step] if layout == "ncthw" else a[i, j : j + step]
                parts.append(s.push(chunk))
                done = i * t + min(j + step, t)
                if progress(done, n * t, "video chunk") is False:
                    raise Cancelled(f"stopped: the progress callback returned False after latent frame {done} of {n * t}")
            parts.append(s.finish())
            videos.append(np.concatenate(parts, axis=f_axis))
        return np.stack(videos)

    def stream(
        self,
        layout: Optional[str] = None,
        output: str = "uint8",
        raw_latents: bool = False,
        progress: Optional[Progress] = None,
        total: Optional[int] = None,
        tile: str = "auto",
    ) -> "VideoStream":
        """A streaming decode of one video: ``push(chunk)`` latent chunks in
        order (each returns the frames ready so far), then ``finish()``. The
        frames equal :meth:`decode_video`'s up to float rounding, with memory
        that does not grow with the video's length (HunyuanVideo 1.5 keeps
        each earlier latent frame's attention keys; LTX-2's decoder is not
        causal and takes the whole clip in one push; MiniMax-H3 decodes clip
        by clip, so its frames arrive a clip at a time, the last at
        ``finish()``). ``layout``, ``output``
        and ``raw_latents`` as :meth:`decode_video`. ``progress(done, total,
        stage)`` is called after each push with the latent frames pushed so
        far and ``total`` (the latent frames the video will have; default the
        frames pushed so far); returning False makes that push raise
        :class:`Cancelled`, and the stream should then be dropped."""
        self._video_only("stream")
        if output not in ("uint8", "float"):
            raise ValueError(f"output {output!r}: expected 'uint8' or 'float'")
        layout = self._video_layout(layout)
        native = self._model.stream(bool(raw_latents), output == "uint8", tile)
        stream = VideoStream(native, layout, self._model.layout, output, self.upscale)
        stream._progress, stream._total = progress, total
        return stream


_DESCRIBE = {"ntchw": "N×T×C×h×w", "ncthw": "N×C×T×h×w"}


class VideoStream:
    """One video decoded chunk by chunk (from :meth:`Vae.stream`).

    ``push(chunk)``: the next latent frames of the video, T×C×h×w (layout
    ``ntchw``) or C×T×h×w (``ncthw``), or 5-D with N = 1. It submits the
    chunk and returns the frames of the chunk before it (the device decodes
    this one meanwhile), possibly none. ``finish()`` returns the rest. Each
    returned array has the layout :meth:`Vae.decode_video` gives for one
    video (float: T'×3×H×W for TAEHV, 3×T'×H×W for Wan; uint8 T'×H×W×3),
    with a batch axis of 1 when the chunks had one; joining them along the
    frame axis gives the whole clip. After an error the stream is unusable
    (the causal caches no longer hold the previous frames).
    """

    def __init__(self, native: Any, layout: str, model_layout: str, output: str, upscale: int) -> None:
        self._native = native
        self._layout = layout
        self._model_layout = model_layout
        self._output = output
        self._upscale = upscale
        self._batched: Optional[bool] = None
        self._size: Optional[Tuple[int, int]] = None
        self.frames_out = 0
        """Frames returned so far."""
        self.latent_frames_in = 0
        """Latent frames pushed so far."""
        self._progress: Optional[Progress] = None
        self._total: Optional[int] = None

    def push(self, chunk: Any) -> np.ndarray:
        a = _as_array(chunk, "chunk")
        batched = a.ndim == 5
        if batched:
            if a.shape[0] != 1:
                raise ValueError(f"chunk: a stream decodes one video: N must be 1, got shape {tuple(a.shape)}")
            a = a[0]
        if a.ndim != 4:
            raise ValueError(
                f"chunk: expected {_DESCRIBE[self._layout][2:]} latent frames of one video "
                f"(or 5-D with N = 1), got shape {tuple(a.shape)}"
            )
        if self._layout == "ncthw":
            a = a.transpose(1, 0, 2, 3)
        a = _f32(a, "chunk")
        got = self._native.push(a.tobytes(), list(a.shape))
        if self._batched is None:
            self._batched = batched
            self._size = (a.shape[2] * self._upscale, a.shape[3] * self._upscale)
        out = self._frames(got)
        self.latent_frames_in += a.shape[0]
        if self._progress is not None:
            done = self.latent_frames_in
            total = max(done, int(self._total)) if self._total is not None else done
            if self._progress(done, total, "video chunk") is False:
                raise Cancelled(f"stopped: the progress callback returned False after {done} latent frames")
        return out

    def finish(self) -> np.ndarray:
        return self._frames(self._native.finish())

    def _frames(self, got: Any) -> np.ndarray:
        if got is None:
            h, w = self._size or (0, 0)
            shape = [0, h, w, 3] if self._output == "uint8" else [0, 3, h, w]
            out = np.zeros(shape, np.uint8 if self._output == "uint8" else np.float32)
        else:
            data, shape, _first = got
            out = np.frombuffer(data, dtype=np.uint8 if self._output == "uint8" else "<f4").reshape(shape)
        self.frames_out += out.shape[0]
        if self._output == "float" and self._model_layout == "ncthw":
            out = out.transpose(1, 0, 2, 3)  # Wan: 3×T'×H×W as diffusers
        return out[None] if self._batched else out


def _path(p: Any) -> str:
    import os

    return os.fspath(p)
