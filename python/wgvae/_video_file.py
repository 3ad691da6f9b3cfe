"""``write_video``: uint8 frames to a video file people can play.

``.mp4`` / ``.mkv`` / ``.mov`` (H.264 yuv420p, CRF 18), ``.webm`` (VP9) and
``.gif`` (one palette for the clip) are encoded by an ``ffmpeg`` process the
frames are piped into as raw RGB24, with the arguments the CLI's
``--video-out`` uses; ``.y4m`` (raw YUV4MPEG2, BT.601 full range, as the
CLI writes it) needs no ffmpeg. ffmpeg is the ``ffmpeg=`` argument, else the
``WGVAE_FFMPEG`` environment variable, else ``ffmpeg`` on PATH, else the
binary of the ``imageio-ffmpeg`` package when it imports. The file is written
beside its name under a temporary name and renamed when complete: an error
or an interruption leaves what was there before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from fractions import Fraction
from typing import Any, Iterable, Iterator, Optional, Union

import numpy as np

_PAD = "pad=ceil(iw/2)*2:ceil(ih/2)*2"
_YUV420 = ["-vf", _PAD, "-pix_fmt", "yuv420p", "-colorspace", "smpte170m", "-color_range", "tv"]
_H264 = ["-c:v", "libx264", "-preset", "medium", "-crf", "18"] + _YUV420

# extension → (ffmpeg muxer, output options); the same as src/cli/ffmpeg.rs.
_CONTAINERS = {
    "mp4": ("mp4", _H264),
    "mkv": ("matroska", _H264),
    "mov": ("mov", _H264),
    "webm": (
        "webm",
        ["-c:v", "libvpx-vp9", "-crf", "30", "-b:v", "0", "-row-mt", "1", "-deadline", "good", "-cpu-used", "4"]
        + _YUV420,
    ),
    "gif": ("gif", ["-vf", "split[a][b];[a]palettegen[p];[b][p]paletteuse", "-loop", "0"]),
}

VIDEO_EXTENSIONS = ("y4m",) + tuple(_CONTAINERS)
"""The extensions :func:`write_video` writes."""

_INSTALL = (
    "install it (apt-get install ffmpeg, brew install ffmpeg, or `pip install imageio-ffmpeg`), "
    "pass ffmpeg=PATH (or set WGVAE_FFMPEG), or write .y4m, which needs no ffmpeg"
)


def find_ffmpeg(ffmpeg: Optional[Union[str, os.PathLike]] = None) -> str:
    """The ffmpeg :func:`write_video` runs: ``ffmpeg``, else ``WGVAE_FFMPEG``,
    else ``ffmpeg`` on PATH, else ``imageio_ffmpeg.get_ffmpeg_exe()``.
    Raises ``FileNotFoundError`` naming the fix when there is none."""
    for given, how in ((ffmpeg, "ffmpeg="), (os.environ.get("WGVAE_FFMPEG") or None, "WGVAE_FFMPEG")):
        if given is not None:
            exe = os.fspath(given)
            if not os.path.isfile(exe):
                raise FileNotFoundError(
                    f"{how} names {exe!r}, which is not a file: give the path of an ffmpeg executable, "
                    "or write .y4m, which needs no ffmpeg"
                )
            return exe
    exe = shutil.which("ffmpeg")
    if exe:
        return exe
    try:
        import imageio_ffmpeg  # type: ignore[import-not-found]

        return str(imageio_ffmpeg.get_ffmpeg_exe())
    except Exception:  # not installed, or its binary missing
        pass
    raise FileNotFoundError(
        "no ffmpeg found (no ffmpeg= argument, no WGVAE_FFMPEG, no `ffmpeg` on PATH, no imageio-ffmpeg): " + _INSTALL
    )


def _rate(fps: Any) -> Fraction:
    try:
        rate = Fraction(fps) if not isinstance(fps, float) else Fraction(fps).limit_denominator(1001000)
    except (TypeError, ValueError, ZeroDivisionError):
        raise ValueError(f"fps {fps!r}: give frames per second as a number (16, 23.976) or a ratio ('24000/1001')")
    if not (Fraction(1, 1000) <= rate <= 10000):
        raise ValueError(f"fps {fps!r}: frames per second must be from 0.001 to 10000")
    return rate


def _chunks(frames: Any) -> Iterator[np.ndarray]:
    """``frames`` as uint8 arrays of T×H×W×3 frames."""
    if isinstance(frames, np.ndarray) or hasattr(frames, "__array__"):
        frames = [frames]
    for chunk in frames:
        a = np.asarray(chunk)
        if a.dtype != np.uint8:
            raise ValueError(
                f"frames: expected uint8 RGB frames (Vae.decode_video(..., output='uint8') and streams give them), "
                f"got {a.dtype}; convert floats with np.clip(x * 255, 0, 255).round().astype(np.uint8)"
            )
        if a.ndim == 5 and a.shape[0] == 1:
            a = a[0]
        if a.ndim == 3:
            a = a[None]
        if a.ndim != 4 or a.shape[-1] != 3:
            raise ValueError(
                f"frames: expected T×H×W×3 (or H×W×3 per frame, or 1×T×H×W×3) uint8 RGB, got shape {tuple(a.shape)}"
            )
        yield np.ascontiguousarray(a)


def _y4m_frame(rgb: np.ndarray) -> bytes:
    """One H×W×3 uint8 frame as a y4m FRAME (BT.601 full range, as src/y4m.rs)."""
    r, g, b = (rgb[..., i].astype(np.float32) for i in range(3))
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128.0 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128.0 + 0.5 * r - 0.418688 * g - 0.081312 * b
    h, w = y.shape
    if h % 2 == 0 and w % 2 == 0:
        cb = cb.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))
        cr = cr.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))
    planes = [np.clip(np.round(p), 0, 255).astype(np.uint8).tobytes() for p in (y, cb, cr)]
    return b"FRAME\n" + b"".join(planes)


def _tail(text: bytes) -> str:
    lines = [ln for ln in text.decode("utf-8", "replace").splitlines() if ln.strip()]
    return " | ".join(lines[-12:])[-1500:] or "(it printed nothing)"


def write_video(
    frames: Union[np.ndarray, Iterable[Any]],
    path: Union[str, os.PathLike],
    fps: Union[int, float, str, Fraction] = 16,
    ffmpeg: Optional[Union[str, os.PathLike]] = None,
) -> int:
    """Writes uint8 RGB frames as a video; returns the number of frames.

    ``frames``: T×H×W×3 uint8 (:meth:`Vae.decode_video` with
    ``output="uint8"``, one video; 1×T×H×W×3 too), or an iterable of such
    chunks or of H×W×3 frames (a :meth:`Vae.stream`'s ``push`` results:
    each is written as it comes). ``path``'s extension picks the format:
    ``.mp4`` / ``.mkv`` / ``.mov`` (H.264), ``.webm`` (VP9), ``.gif`` through
    ffmpeg (see :func:`find_ffmpeg` for where it is looked for), ``.y4m``
    without it. ``fps``: 16 (Wan's), 24, 23.976, ``"24000/1001"``, ….
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in VIDEO_EXTENSIONS:
        supported = ", ".join(f".{e}" for e in VIDEO_EXTENSIONS)
        raise ValueError(f"{path}: a video must be a {supported} file, not {ext or 'no extension'!r}")
    rate = _rate(fps)
    exe = find_ffmpeg(ffmpeg) if ext != "y4m" else None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{path}: the folder {folder!r} does not exist; create it first")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a folder; give a file name inside it")
    fd, tmp = tempfile.mkstemp(prefix=".wgvae-", dir=folder)
    os.close(fd)
    proc: Optional[subprocess.Popen] = None
    err = tempfile.TemporaryFile()
    done = False
    broken = False
    count = 0
    size = None
    out = None
    try:
        for chunk in _chunks(frames):
            if size is None:
                size = chunk.shape[1:3]
                h, w = size
                if h == 0 or w == 0:
                    raise ValueError(f"frames: a {w}×{h} video has no pixels")
                if exe is None:
                    out = open(tmp, "wb")
                    sampling = "C420jpeg XYSCSS=420JPEG" if h % 2 == 0 and w % 2 == 0 else "C444 XYSCSS=444"
                    header = f"YUV4MPEG2 W{w} H{h} F{rate.numerator}:{rate.denominator} Ip A1:1 {sampling}"
                    out.write(f"{header} XCOLORRANGE=FULL\n".encode())
                else:
                    muxer, options = _CONTAINERS[ext]
                    cmd = [exe, "-hide_banner", "-nostats", "-loglevel", "error"]
                    cmd += ["-f", "rawvideo", "-pix_fmt", "rgb24", "-video_size", f"{w}x{h}"]
                    cmd += ["-framerate", f"{rate.numerator}/{rate.denominator}", "-i", "pipe:0", "-an"]
                    cmd += options + ["-f", muxer, "-y", "file:" + tmp]
                    try:
                        proc = subprocess.Popen(
                            cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err
                        )
                    except OSError as e:
                        raise RuntimeError(f"{path}: cannot start ffmpeg {exe!r} ({e}): {_INSTALL}") from e
                    out = proc.stdin
            if chunk.shape[1:3] != size:
                raise ValueError(
                    f"frames: frame {count} is {chunk.shape[2]}×{chunk.shape[1]}, the first were {size[1]}×{size[0]}; "
                    "a video's frames all have one size"
                )
            try:
                if exe is None:
                    for frame in chunk:
                        out.write(_y4m_frame(frame))
                else:
                    out.write(chunk.tobytes())
            except BrokenPipeError:
                broken = True  # ffmpeg stopped: its status and messages below say why
                break
            count += chunk.shape[0]
        if size is None:
            raise ValueError("frames: no frames to write")
        try:
            out.close()
        except BrokenPipeError:
            pass
        if proc is not None:
            code = proc.wait()
            if code != 0 or broken:
                err.seek(0)
                raise RuntimeError(f"{path}: ffmpeg ({exe}) exited with status {code}: {_tail(err.read())}")
        # mkstemp's 0600 → the mode a plain create gives (0666 less the umask).
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
        done = True
        return count
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if out is not None and not out.closed:
            try:
                out.close()
            except OSError:
                pass
        err.close()
        if not done:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
