"""Golden latents for the TAEHV video encoders (tests/video_encode.rs).

Runs madebyollin/taehv's `taehv.py` (MIT; pass its path with --taehv-py) on
the seeded random taew2_1 / taew2_2 weights of ../shared/golden and a
closed-form input video (no input file stored; tests/video_encode.rs builds
the same frames), and writes only the small latents and a json.

    /work/torchenv/bin/python tests/data/taehv_encoder/make_golden.py \
        --taehv-py /path/to/taehv.py --shared ../shared
"""

import argparse
import importlib.util
import json
import math
import os

import numpy as np
import torch
from safetensors.torch import load_file

# Input: N=1, T=10 frames (not a multiple of 4: encode_video pads with the
# last frame), 3×64×80, values in [0, 1].
T, H, W = 10, 64, 80


def video():
    t = np.arange(T, dtype=np.float64)[:, None, None, None]
    c = np.arange(3, dtype=np.float64)[None, :, None, None]
    y = np.arange(H, dtype=np.float64)[None, None, :, None]
    x = np.arange(W, dtype=np.float64)[None, None, None, :]
    v = 0.5 + 0.5 * np.sin(0.3 * t + 1.7 * c + 0.11 * y - 0.07 * x + 0.013 * x * y)
    return v.astype(np.float32)[None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--taehv-py", required=True)
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("taehv", args.taehv_py)
    taehv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(taehv)
    torch.manual_seed(0)
    x = torch.from_numpy(video())
    info = {
        "model": "TAEHV encoder (madebyollin/taehv taehv.py, encode_video)",
        "input": "N=1, T=10, 3x64x80: 0.5 + 0.5 sin(0.3 t + 1.7 c + 0.11 y - 0.07 x + 0.013 x y)",
        "layout": "NTCHW",
    }
    for name, patch, channels in [("taew2_1", 1, 16), ("taew2_2", 2, 48)]:
        path = os.path.join(args.shared, "golden", f"{name}-rand", f"{name}.safetensors")
        model = taehv.TAEHV(checkpoint_path=None, patch_size=patch, latent_channels=channels)
        sd = {k: v.float() for k, v in load_file(path).items()}
        model.load_state_dict(sd)
        model.eval()
        with torch.no_grad():
            par = model.encode_video(x, parallel=True, show_progress_bar=False)
            seq = model.encode_video(x, parallel=False, show_progress_bar=False)
        diff = (par - seq).abs().max().item()
        np.save(os.path.join(args.out, f"{name}_latents.npy"), par.numpy().astype(np.float32))
        info[name] = {
            "weights": f"golden/{name}-rand/{name}.safetensors",
            "latents": f"{name}_latents.npy",
            "latents_shape": list(par.shape),
            "max_abs_parallel_vs_sequential": diff,
            "latent_abs_max": par.abs().max().item(),
        }
        print(name, list(par.shape), "parallel vs sequential", diff)
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
