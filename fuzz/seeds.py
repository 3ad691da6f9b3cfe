#!/usr/bin/env python3
"""Writes the hand-made seed inputs of fuzz/corpus/<target>/seed-* (small
valid and near-valid files of each format). Run from fuzz/: python3 seeds.py"""
import json, os, struct, zlib

def out(target, name, data):
    d = os.path.join("corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)

def floats(fmt, n, f=lambda i: (i % 7) * 0.25 - 0.5):
    code = {"f4": "f", "f2": "e", "f8": "d", "i4": "i"}[fmt[1:]]
    vals = [int(f(i)) if code == "i" else f(i) for i in range(n)]
    return struct.pack(("<" if fmt[0] != ">" else ">") + code * n, *vals)

def npy(descr, shape, fortran=False, version=1, data=None):
    n = 1
    for s in shape:
        n *= s
    head = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        descr, fortran, "".join(f"{s}, " for s in shape) if len(shape) != 1 else f"{shape[0]},")
    pre = 10 if version == 1 else 12
    head += " " * ((64 - (pre + len(head) + 1) % 64) % 64) + "\n"
    hl = struct.pack("<H", len(head)) if version == 1 else struct.pack("<I", len(head))
    body = data if data is not None else floats(descr, n)
    return b"\x93NUMPY" + bytes([version, 0]) + hl + head.encode() + body

out("fuzz_npy", "f32-1x4x2x2", npy("<f4", [1, 4, 2, 2]))
out("fuzz_npy", "f16-4x2x2", npy("<f2", [4, 2, 2]))
out("fuzz_npy", "f64-1x16x1x2", npy("<f8", [1, 16, 1, 2]))
out("fuzz_npy", "f32-be", npy(">f4", [1, 4, 1, 1]))
out("fuzz_npy", "fortran", npy("<f4", [1, 4, 1, 2], fortran=True))
out("fuzz_npy", "int32", npy("<i4", [1, 4, 1, 1]))
out("fuzz_npy", "v2-header", npy("<f4", [2, 4, 1, 1], version=2))
out("fuzz_npy", "rank2", npy("<f4", [4, 4]))
out("fuzz_npy", "empty-dim", npy("<f4", [1, 4, 0, 2]))
out("fuzz_npy", "nan", npy("<f4", [1, 4, 1, 1], data=struct.pack("<4f", 0, float("nan"), 1, 2)))
# Found by fuzzing: npyz's header parser backtracks exponentially on these.
nested = "{'descr': '<f4', 'fortran_order': False, 'shape': " + "[" * 20 + " }\n"
out("fuzz_npy", "nested-header", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(nested)) + nested.encode())
out("fuzz_npy", "huge-header-len", b"\x93NUMPY\x02\x00\xff\xff\xff\xff{'descr'")
out("fuzz_npy", "truncated", npy("<f4", [1, 4, 2, 2])[:-5])

def st(tensors, meta=None):
    """tensors: [(name, dtype, shape, bytes)]"""
    header, data = {}, b""
    if meta:
        header["__metadata__"] = meta
    for name, dt, shape, b in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data

def t(name, shape, dt="F32"):
    n = 1
    for s in shape:
        n *= s
    fmt = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I32": "<i4"}.get(dt)
    b = floats(fmt, n) if fmt else bytes((i * 37) & 0x7f for i in range(2 * n))  # BF16
    return (name, dt, shape, b)

out("fuzz_safetensors", "latents-f32", st([t("latents", [1, 4, 2, 2])]))
out("fuzz_safetensors", "latents-f16", st([t("latents", [4, 2, 2], "F16")], {"format": "pt"}))
out("fuzz_safetensors", "bf16", st([t("x", [1, 4, 1, 2], "BF16")]))
out("fuzz_safetensors", "f64", st([t("x", [1, 4, 1, 1], "F64")]))
out("fuzz_safetensors", "i32", st([t("latents", [1, 4, 1, 1], "I32")]))
out("fuzz_safetensors", "two", st([t("a", [1, 4, 1, 1]), t("latents", [1, 4, 1, 1])]))
out("fuzz_safetensors", "empty-header", st([]))

def kl_diffusers(dt="F16", c=8, lat=4, prefix=""):
    return st([t(prefix + k, s, dt) for k, s in [
        ("decoder.conv_in.weight", [c, lat, 3, 3]),
        ("decoder.conv_in.bias", [c]),
        ("decoder.up_blocks.0.resnets.0.conv2.weight", [c, c, 3, 3]),
        ("decoder.up_blocks.0.resnets.1.conv1.weight", [c, c, 1, 1]),
        ("decoder.up_blocks.1.resnets.0.conv2.weight", [c, c, 1, 1]),
        ("decoder.mid_block.attentions.0.to_q.weight", [c, c]),
        ("decoder.conv_out.weight", [3, c, 3, 3]),
        ("post_quant_conv.weight", [lat, lat, 1, 1]),
        ("quant_conv.weight", [2 * lat, 2 * lat, 1, 1]),
        ("encoder.conv_in.weight", [c, 3, 1, 1]),
    ]])

def kl_ldm(prefix):
    return st([t(prefix + k, s, "F16") for k, s in [
        ("decoder.conv_in.weight", [8, 4, 3, 3]),
        ("decoder.mid.block_1.conv1.weight", [8, 8, 1, 1]),
        ("decoder.mid.attn_1.q.weight", [8, 8, 1, 1]),
        ("decoder.up.1.block.0.conv2.weight", [8, 8, 1, 1]),
        ("decoder.up.0.block.0.nin_shortcut.weight", [8, 8, 1, 1]),
        ("decoder.up.0.upsample.conv.weight", [8, 8, 1, 1]),
        ("decoder.norm_out.weight", [8]),
        ("encoder.down.0.downsample.conv.bias", [8]),
        ("post_quant_conv.weight", [4, 4, 1, 1]),
    ]] + ([t("model.diffusion_model.x", [2], "F16")] if prefix else []))

def tae(pool=False, lat=4, diffusers=False):
    keys = [("1.weight", [64, lat, 3, 3]), ("1.bias", [64]), ("3.conv.0.weight", [64, 64, 1, 1]),
            ("19.weight", [3, 64, 1, 1]), ("14.weight", [lat, 64, 1, 1])]
    if pool:
        keys.append(("3.pool.0.weight", [64, 64, 1, 1]))
    if diffusers:
        keys = [(f"decoder.layers.{int(k.split('.')[0]) - 1}.{k.split('.', 1)[1]}", s) for k, s in keys[:4]] + \
               [("encoder.layers.14.weight", [lat, 64, 1, 1]), ("encoder.layers.0.weight", [64, 3, 1, 1])]
    return st([t(k, s, "F16") for k, s in keys])

for target in ["fuzz_layout", "fuzz_safetensors"]:
    out(target, "kl-diffusers", kl_diffusers())
    out(target, "kl-diffusers-16ch-f32", kl_diffusers("F32", 8, 16))
    out(target, "ldm-vae", kl_ldm(""))
    out(target, "ldm-checkpoint", kl_ldm("first_stage_model."))
    out(target, "tae", tae())
    out(target, "tae-pool", tae(True))
    out(target, "tae-diffusers", tae(diffusers=True))
out("fuzz_layout", "unknown", st([t("model.x", [2])]))

sd15 = {"block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "norm_num_groups": 32,
        "latent_channels": 4, "out_channels": 3, "scaling_factor": 0.18215, "shift_factor": None,
        "_class_name": "AutoencoderKL", "sample_size": 512}
out("fuzz_config", "sd15", json.dumps(sd15, indent=2).encode())
out("fuzz_config", "flux", json.dumps({**sd15, "latent_channels": 16, "scaling_factor": 0.3611,
    "shift_factor": 0.1159, "use_post_quant_conv": False, "use_quant_conv": False,
    "mid_block_add_attention": True}).encode())
out("fuzz_config", "minimal", b'{"block_out_channels": [32]}')
out("fuzz_config", "bad-groups", b'{"block_out_channels": [32, 48], "norm_num_groups": 0}')
out("fuzz_config", "huge", b'{"block_out_channels": [1e30], "layers_per_block": 18446744073709551615}')
out("fuzz_config", "not-object", b'[1, 2, 3]')

wan = {"_class_name": "AutoencoderKLWan", "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4],
       "num_res_blocks": 2, "temperal_downsample": [False, True, True],
       "latents_mean": [0.0] * 16, "latents_std": [1.0] * 16}
out("fuzz_wan_config", "wan21", json.dumps(wan, indent=2).encode())
out("fuzz_wan_config", "no-stats", json.dumps({k: v for k, v in wan.items() if not k.startswith("latents")}).encode())
out("fuzz_wan_config", "z8-no-class", b'{"z_dim": 8, "base_dim": 16, "dim_mult": [1, 2], "temperal_downsample": [true]}')
out("fuzz_wan_config", "bad-fields", b'{"z_dim": -16, "base_dim": 0, "dim_mult": [1, 0], "num_res_blocks": 1e12}')
out("fuzz_wan_config", "wan22", b'{"_class_name": "AutoencoderKLWan", "is_residual": true, "patch_size": 2}')
out("fuzz_wan_config", "empty", b'{}')

def png(w, h, color, depth, rows, plte=None, interlace=0):
    def chunk(k, d):
        return struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d))
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, interlace)
    raw = b"".join(b"\x00" + r for r in rows)
    body = chunk(b"IHDR", ihdr) + (chunk(b"PLTE", plte) if plte else b"")
    return b"\x89PNG\r\n\x1a\n" + body + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")

out("fuzz_png", "rgb-8x8", png(8, 8, 2, 8, [bytes((x * 30 + y * 7 + c) & 0xff for x in range(8) for c in range(3)) for y in range(8)]))
out("fuzz_png", "rgba-5x7", png(5, 7, 6, 8, [bytes((x * y + c * 50) & 0xff for x in range(5) for c in range(4)) for y in range(7)]))
out("fuzz_png", "gray16-8x16", png(8, 16, 0, 16, [bytes((x + y) & 0xff for x in range(16)) for y in range(16)]))
out("fuzz_png", "palette-3x3", png(3, 3, 3, 8, [bytes([0, 1, 2])] * 3, plte=bytes(range(9))))
out("fuzz_png", "gray1-9x2", png(9, 2, 0, 1, [b"\xaa\x80", b"\x55\x00"]))
out("fuzz_png", "interlaced-8x8", png(8, 8, 2, 8, [bytes(24)] * 8, interlace=1))
