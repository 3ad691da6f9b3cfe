"""wgvae.write_video: frames to .mp4/.webm/.gif through ffmpeg (the imageio-ffmpeg wheel's in CI), .y4m
without it; played back with the same ffmpeg: frame count, size, rate, pixels close to the frames given.

Without any ffmpeg the playback tests skip with a message, unless WGVAE_REQUIRE_FFMPEG=1 (CI), where they fail.
"""

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

import wgvae


@pytest.fixture(scope="module")
def ffmpeg():
    try:
        return wgvae.find_ffmpeg()
    except FileNotFoundError as e:
        if os.environ.get("WGVAE_REQUIRE_FFMPEG") == "1":
            pytest.fail(f"WGVAE_REQUIRE_FFMPEG=1 but {e}")
        pytest.skip(f"SKIPPED: {e}")


def frames(t=9, h=64, w=80):
    """A moving colour pattern (smooth enough for a lossy codec to keep)."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack(
        [np.stack([(x * 3 + 10 * i) % 256, (y * 4) % 256, ((x + y) * 2 + 20 * i) % 256], -1) for i in range(t)]
    ).astype(np.uint8)


def play(ffmpeg, path):
    """(ffmpeg's line for the video stream, the frames as T×H×W×3 uint8)."""
    info = subprocess.run([ffmpeg, "-hide_banner", "-i", str(path)], capture_output=True, text=True).stderr
    stream = next(line for line in info.splitlines() if "Video:" in line)
    raw = subprocess.run(
        [ffmpeg, "-v", "error", "-i", str(path), "-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=True,
    ).stdout
    return stream, raw


@pytest.mark.parametrize(
    "ext, fps, shown, bound",
    [
        ("mp4", 24, "24 fps", 6.0),
        ("webm", 12.5, "12.50 fps", 6.0),
        # GIF stores delays in 1/100 s: 16 fps is 6 cs a frame.
        ("gif", 16, "16.67 fps", 16.0),
        ("mkv", "24000/1001", "23.98 fps", 6.0),
        ("y4m", 16, "16 fps", 3.0),
    ],
)
def test_formats_play_back(ffmpeg, tmp_path, ext, fps, shown, bound):
    want = frames()
    path = tmp_path / f"clip.{ext}"
    assert wgvae.write_video(want, path, fps=fps) == 9
    stream, raw = play(ffmpeg, path)
    assert " 80x64" in stream and f" {shown}" in stream, stream
    got = np.frombuffer(raw, np.uint8)
    assert got.size == want.size, (got.size, want.size, stream)
    mean = np.abs(got.reshape(want.shape).astype(np.int32) - want).mean()
    print(f"{ext}: mean abs {mean:.2f} levels (bound {bound}); {stream.strip()}")
    assert mean <= bound
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    # The mode a plain create gives, not mkstemp's 0600.
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_stream_chunks_are_written_as_they_come(ffmpeg, shared, tmp_path):
    """A TAEHV stream's push() results straight into write_video (a generator: no clip held)."""
    d = shared / "golden" / "taew2_1-rand"
    vae = wgvae.Vae(d / "taew2_1.safetensors", dtype="f32")
    latents = np.ascontiguousarray(np.load(d / "latents.npy")[0, :, :, :2, :3])
    stream = vae.stream()
    sizes = []

    def chunks():
        for t in range(latents.shape[0]):
            got = stream.push(latents[t : t + 1])
            sizes.append(got.shape[0])
            yield got
        yield stream.finish()

    path = tmp_path / "stream.mp4"
    assert wgvae.write_video(chunks(), path) == 9
    assert sum(sizes) < 9  # finish() gave the last chunk's frames
    stream_line, raw = play(ffmpeg, path)
    assert " 24x16" in stream_line and " 16 fps" in stream_line, stream_line
    assert len(raw) == 9 * 16 * 24 * 3


def test_no_ffmpeg_is_a_clear_error_and_y4m_needs_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("WGVAE_FFMPEG", raising=False)
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails
    with pytest.raises(FileNotFoundError, match=r"no ffmpeg found.*install.*ffmpeg=PATH.*\.y4m"):
        wgvae.write_video(frames(), tmp_path / "clip.mp4")
    with pytest.raises(FileNotFoundError, match="not a file"):
        wgvae.write_video(frames(), tmp_path / "clip.mp4", ffmpeg=tmp_path / "nothing")
    assert list(tmp_path.iterdir()) == []
    path = tmp_path / "clip.y4m"
    assert wgvae.write_video(frames(3, 4, 6), path, fps="30000/1001") == 3
    data = path.read_bytes()
    header = b"YUV4MPEG2 W6 H4 F30000:1001 Ip A1:1 C420jpeg XYSCSS=420JPEG XCOLORRANGE=FULL\n"
    assert data.startswith(header)
    assert len(data) == len(header) + 3 * (6 + 24 + 2 * 6)


def test_bad_input_is_refused_and_leaves_the_old_file(tmp_path):
    path = tmp_path / "clip.y4m"
    path.write_bytes(b"old")
    with pytest.raises(ValueError, match="uint8"):
        wgvae.write_video(frames().astype(np.float32), path)
    with pytest.raises(ValueError, match=r"\.y4m, \.mp4.*\.gif"):
        wgvae.write_video(frames(), tmp_path / "clip.avi")
    with pytest.raises(ValueError, match="one size"):
        wgvae.write_video([frames(1, 4, 6), frames(1, 6, 4)], path)
    with pytest.raises(ValueError, match="frames per second"):
        wgvae.write_video(frames(), path, fps=0)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["clip.y4m"]


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for ffmpeg")
def test_a_failing_ffmpeg_is_reported(tmp_path):
    fake = tmp_path / "fake-ffmpeg"
    fake.write_text("#!/bin/sh\necho 'Unknown encoder: pretend it broke' >&2\nexit 3\n")
    fake.chmod(0o755)
    path = tmp_path / "clip.mp4"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="status 3.*pretend it broke"):
        wgvae.write_video(frames(), path, ffmpeg=fake)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4", "fake-ffmpeg"]
