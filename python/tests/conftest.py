"""Shared fixtures: the ../shared test data (goldens, weights) and a tiny PNG reader.

As the Rust tests: without ../shared the tests that need it skip with a message,
unless WGVAE_REQUIRE_SHARED=1 (CI), where they fail.
"""

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

PROJECT = Path(__file__).resolve().parents[2]


def pytest_sessionstart(session):
    """WGVAE_EXPECT_WHEEL=1 (CI): `wgvae` must come from an installed wheel, not from python/wgvae."""
    if os.environ.get("WGVAE_EXPECT_WHEEL") != "1":
        return
    import wgvae

    where = Path(wgvae.__file__).resolve()
    if PROJECT / "python" in where.parents:
        pytest.exit(f"WGVAE_EXPECT_WHEEL=1 but wgvae was imported from the source tree ({where})", returncode=1)
    print(f"wgvae {wgvae.__version__} from {where.parent}")


def shared_dir():
    candidates = []
    if os.environ.get("WGVAE_SHARED_DIR"):
        candidates.append(Path(os.environ["WGVAE_SHARED_DIR"]))
    candidates.append(PROJECT.parent / "shared")
    for c in candidates:
        if (c / "README.md").exists():
            return c
    return None


@pytest.fixture(scope="session")
def shared():
    d = shared_dir()
    if d is None:
        why = "../shared (golden data and weights) is not beside the project root (or set WGVAE_SHARED_DIR)"
        if os.environ.get("WGVAE_REQUIRE_SHARED") == "1":
            pytest.fail(f"WGVAE_REQUIRE_SHARED=1 but {why}")
        pytest.skip(f"SKIPPED: {why}")
    return d


def read_png_rgb(path):
    """8-bit RGB or RGBA, non-interlaced PNG → uint8 H×W×3 (enough for the goldens; no Pillow needed)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    w, h, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, (path, header)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=y * (stride + 1) + 1).astype(np.int32)
        cur = np.zeros(stride, dtype=np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        else:
            for x in range(stride):
                a = cur[x - bpp] if x >= bpp else 0
                b = prev[x]
                c = prev[x - bpp] if x >= bpp else 0
                if f == 1:
                    p = a
                elif f == 3:
                    p = (a + b) // 2
                else:  # Paeth
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[x] = (line[x] + p) & 255
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3]


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)
