import os
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

_Bytes = Union[int, str, None]
_Path = Union[str, "os.PathLike[str]"]

def adapters() -> List[Dict[str, Any]]:
    """Every adapter wgpu sees: index, name, backend, device_type, driver, driver_info, shader_f16."""

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
    def upscale(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def random_weights(self) -> bool: ...
    def decode(
        self,
        latents: Any,
        tile: str = "auto",
        raw_latents: bool = False,
        output: str = "uint8",
        tile_size: Optional[int] = None,
        max_memory: _Bytes = None,
    ) -> Union[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
        """uint8 N×H×W×3 (output="uint8") or float32 N×3×H×W (output="float")."""
    def encode(
        self,
        images: Any,
        tile: str = "auto",
        raw_latents: bool = False,
        sample: Optional[int] = None,
        tile_size: Optional[int] = None,
        max_memory: _Bytes = None,
    ) -> npt.NDArray[np.float32]:
        """float32 latents N×C×h×w from uint8 N×H×W×3 or float N×3×H×W in [-1, 1]."""
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
