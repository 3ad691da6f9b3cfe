import os
from fractions import Fraction
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

_Bytes = Union[int, str, None]
_Path = Union[str, "os.PathLike[str]"]

Progress = Callable[[int, int, str], Optional[bool]]
"""progress(done, total, stage), called between tiles (decode/encode) or chunks (video) with the GIL held.
Returning False stops the run at the next tile or chunk with Cancelled; an exception it raises stops the run
and is re-raised; a pending signal (Ctrl-C) stops a tiled run with KeyboardInterrupt. None or True go on."""

PRESETS: List[str]
"""The NAMEs of Vae("preset:NAME") (random weights): image presets, qwenimage, wan21, wan22, hunyuanvideo15, ltx2, minimax-h3."""

class Cancelled(RuntimeError):
    """A run stopped because its progress callback returned False. The Vae stays usable."""

def adapters() -> List[Dict[str, Any]]:
    """Every adapter wgpu sees: index, name, backend, device_type, driver, driver_info, shader_f16,
    vendor_id, device_id, pci_bus_id ("0000:01:00.0"; "" where the backend does not report it)."""

VIDEO_EXTENSIONS: Tuple[str, ...]

def find_ffmpeg(ffmpeg: Optional[_Path] = None) -> str:
    """The ffmpeg write_video runs: ffmpeg=, else WGVAE_FFMPEG, else `ffmpeg` on PATH, else
    imageio_ffmpeg.get_ffmpeg_exe(); FileNotFoundError naming the fix when there is none."""

def write_video(
    frames: Any,
    path: _Path,
    fps: Union[int, float, str, "Fraction"] = 16,
    ffmpeg: Optional[_Path] = None,
) -> int:
    """uint8 T×H×W×3 frames (or an iterable of chunks / H×W×3 frames, written as they come) to
    .mp4/.mkv/.mov (H.264), .webm (VP9), .gif through ffmpeg, or .y4m without it; returns the
    number of frames. The file appears complete or not at all."""

class Vae:
    def __init__(
        self,
        path_or_preset: _Path,
        dtype: str = "auto",
        policy: str = "planned",
        adapter: Union[int, str, None] = None,
        max_memory: _Bytes = None,
        encoder: Optional[_Path] = None,
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def latent_channels(self) -> int: ...
    @property
    def output_range(self) -> Tuple[float, float]:
        """The range of output="float" values: (-1, 1) (diffusers, Wan) or (0, 1) (TAE, TAEHV)."""
    @property
    def pipeline_channels(self) -> int:
        """128 for FLUX.2 (its BatchNorm-normalised 2×2-patch maps), else latent_channels."""
    @property
    def upscale(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def random_weights(self) -> bool: ...
    @property
    def is_video(self) -> bool:
        """True for a video VAE (TAEHV file; Wan 2.1 / 2.2, HunyuanVideo 1.5, LTX-2 or MiniMax-H3 VAE; their presets)."""
    @property
    def layout(self) -> Optional[str]:
        """"ntchw" (TAEHV) or "ncthw" (Wan) for a video VAE; None for an image VAE."""
    def frames_for(self, latent_frames: int) -> int: ...
    def decode_video(
        self,
        latents: Any,
        layout: Optional[str] = None,
        output: str = "uint8",
        raw_latents: bool = False,
        progress: Optional[Progress] = None,
        tile: str = "auto",
    ) -> Union[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
        """With progress: decoded through stream() one latent frame per chunk, progress after each.
        tile: "auto" (the model's default; MiniMax-H3 in its reference's 256-px tiles), "off", "fast".
        uint8 N×T'×H×W×3, or float32 TAEHV N×T'×3×H×W (raw) / Wan N×3×T'×H×W (clamped); 4-D in, no N out."""
    def stream(
        self,
        layout: Optional[str] = None,
        output: str = "uint8",
        raw_latents: bool = False,
        progress: Optional[Progress] = None,
        total: Optional[int] = None,
        tile: str = "auto",
    ) -> VideoStream:
        """progress(latent frames pushed, total or pushed, "video chunk") after each push; False: Cancelled."""
    def decode(
        self,
        latents: Any,
        tile: str = "auto",
        raw_latents: bool = False,
        output: str = "uint8",
        tile_size: Optional[int] = None,
        max_memory: _Bytes = None,
        size: Optional[Tuple[int, int]] = None,
        overlap: Optional[int] = None,
        progress: Optional[Progress] = None,
    ) -> Union[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
        """uint8 N×H×W×3 (output="uint8") or float32 N×3×H×W (output="float").
        overlap: tile="fast" only (image pixels). progress: after each tile step (untiled: no call)."""
    def encode(
        self,
        images: Any,
        tile: str = "auto",
        raw_latents: bool = False,
        sample: Optional[int] = None,
        tile_size: Optional[int] = None,
        max_memory: _Bytes = None,
        value_range: Tuple[float, float] = (-1.0, 1.0),
        overlap: Optional[int] = None,
        progress: Optional[Progress] = None,
    ) -> npt.NDArray[np.float32]:
        """float32 latents N×C×h×w from uint8 N×H×W×3 or float N×3×H×W in ``value_range``."""
    def encode_moments(
        self,
        images: Any,
        tile: str = "auto",
        tile_size: Optional[int] = None,
        max_memory: _Bytes = None,
        value_range: Tuple[float, float] = (-1.0, 1.0),
        progress: Optional[Progress] = None,
    ) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """The encoder's raw (mean, std), float32 N×C×h×w (AutoencoderKL, FLUX.2)."""
    def memory(
        self,
        size: Tuple[int, int] = (1024, 1024),
        batch: int = 1,
        dtype: Optional[str] = None,
        encode: bool = False,
        tile: str = "auto",
        tile_size: Optional[int] = None,
        max_memory: _Bytes = None,
    ) -> Dict[str, Any]:
        """The dict `wgvae memory --json` prints for the same arguments."""

class VideoStream:
    frames_out: int
    latent_frames_in: int
    def push(self, chunk: Any) -> Union[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
        """The frames ready after this chunk (of the chunk before it; possibly none)."""
    def finish(self) -> Union[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
        """The remaining frames."""
