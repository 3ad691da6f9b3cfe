"""`progress=`: the callback the library calls between tiles (decode, encode) and chunks (video),
and stopping a run from it (False → wgvae.Cancelled, its own exception, Ctrl-C)."""

import numpy as np
import pytest

import wgvae


@pytest.fixture(scope="module")
def sd(shared):
    d = shared / "golden" / "aekl-tiny-sd"
    return wgvae.Vae(d, dtype="f32"), np.load(d / "latents.npy")


class Calls:
    def __init__(self, stop_after=None, result=False):
        self.calls, self.stop_after, self.result = [], stop_after, result

    def __call__(self, done, total, stage):
        self.calls.append((done, total, stage))
        if self.stop_after is not None and len(self.calls) >= self.stop_after:
            return self.result
        return None


def test_cancelled_is_a_runtime_error():
    assert issubclass(wgvae.Cancelled, RuntimeError)
    assert "sd15" in wgvae.PRESETS and "wan21" in wgvae.PRESETS and "qwenimage" in wgvae.PRESETS


def test_decode_progress_reaches_total(sd):
    vae, latents = sd
    p = Calls()
    got = vae.decode(latents, tile="exact", tile_size=32, progress=p)
    done, total, stage = p.calls[-1]
    assert done == total == len(p.calls) > 4 and isinstance(stage, str) and stage
    assert [c[0] for c in p.calls] == list(range(1, total + 1))
    assert np.array_equal(got, vae.decode(latents, tile="exact", tile_size=32))
    p = Calls()
    vae.decode(latents, tile="fast", tile_size=64, overlap=16, progress=p)
    assert p.calls[-1][:2] == (len(p.calls), len(p.calls)) and p.calls[-1][2] == "fast tile"
    p = Calls()
    vae.decode(latents, tile="off", progress=p)
    assert p.calls == []  # one submission: nothing between tiles


def test_returning_false_stops_early_and_the_vae_still_works(sd):
    vae, latents = sd
    full = Calls()
    want = vae.decode(latents, tile="exact", tile_size=32, progress=full)
    p = Calls(stop_after=1)
    with pytest.raises(wgvae.Cancelled, match="progress callback returned False"):
        vae.decode(latents, tile="exact", tile_size=32, progress=p)
    assert len(p.calls) == 1 < len(full.calls)
    assert np.array_equal(vae.decode(latents, tile="exact", tile_size=32), want)


def test_a_raising_callback_stops_with_its_exception(sd):
    vae, latents = sd

    class Boom(Exception):
        pass

    calls = []

    def boom(done, total, stage):
        calls.append(done)
        raise Boom("from the callback")

    with pytest.raises(Boom, match="from the callback"):
        vae.decode(latents, tile="fast", tile_size=32, progress=boom)
    assert calls == [1]
    with pytest.raises(TypeError, match="progress: expected a callable"):
        vae.decode(latents, progress=3)


def test_keyboard_interrupt_stops_between_tiles(sd):
    vae, latents = sd
    import signal

    calls = []

    def ctrl_c(done, total, stage):
        calls.append(done)
        if done == 1:
            signal.raise_signal(signal.SIGINT)  # pending until the library checks signals

    # Python's own Ctrl-C handler, even where the test process started with
    # SIGINT ignored (a background job of a non-interactive shell, where
    # Python installs none and raise_signal would do nothing).
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            vae.decode(latents, tile="exact", tile_size=32, progress=ctrl_c)
    finally:
        signal.signal(signal.SIGINT, old)
    assert len(calls) <= 2


def test_encode_progress_and_cancel(sd, shared):
    vae, _ = sd
    from conftest import read_png_rgb

    png = read_png_rgb(shared / "golden" / "aekl-tiny-sd" / "encode_input.png")
    p = Calls()
    want = vae.encode(png, tile="exact", tile_size=32, progress=p)
    assert p.calls and p.calls[-1][0] == p.calls[-1][1] == len(p.calls)
    stop = Calls(stop_after=1)
    with pytest.raises(wgvae.Cancelled):
        vae.encode(png, tile="exact", tile_size=32, progress=stop)
    assert len(stop.calls) < len(p.calls)
    assert np.array_equal(vae.encode(png, tile="exact", tile_size=32), want)


def test_video_progress_per_chunk_and_cancel(shared):
    d = shared / "golden" / "wan21-tiny"
    vae = wgvae.Vae(d, dtype="f32")
    z = np.ascontiguousarray(np.load(d / "latents.npy")[..., :2, :3])
    t = z.shape[2]
    whole = vae.decode_video(z, output="float", raw_latents=True)
    p = Calls()
    got = vae.decode_video(z, output="float", raw_latents=True, progress=p)
    assert [c[:2] for c in p.calls] == [(i, t) for i in range(1, t + 1)]
    assert got.shape == whole.shape and np.abs(got - whole).max() <= 1e-4
    u8 = vae.decode_video(z, raw_latents=True, progress=Calls())
    assert np.array_equal(u8, vae.decode_video(z, raw_latents=True))
    with pytest.raises(wgvae.Cancelled):
        vae.decode_video(z, raw_latents=True, progress=Calls(stop_after=1))
    s = vae.stream(raw_latents=True, progress=(p := Calls(stop_after=2)), total=t)
    s.push(z[0, :, 0:1])
    with pytest.raises(wgvae.Cancelled):
        s.push(z[0, :, 1:2])
    assert [c[:2] for c in p.calls] == [(1, t), (2, t)]
