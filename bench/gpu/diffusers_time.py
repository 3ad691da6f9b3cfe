#!/usr/bin/env python3
"""diffusers' AutoencoderKL decode (SD1.5 architecture, random weights) timed on a CUDA GPU the
way bench/gpu/tune.sh compares it with wgvae: GPU time from CUDA events beside wall time, with
cudnn.benchmark on, in NCHW and in channels_last. Writes one JSON object per cell (a list).

    python3 bench/gpu/diffusers_time.py --sizes 512,1024 --dtypes float16 --runs 5 --json out.json

Needs torch with CUDA and diffusers (tune.sh carries diffusers as a wheel where it is missing);
without CUDA it exits 3 after saying so, and tune.sh reports the stage as not run.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="512,1024")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from compare_diffusers import make_vae

    if not torch.cuda.is_available():
        print("diffusers_time.py: torch sees no CUDA device", file=sys.stderr)
        return 3
    torch.backends.cudnn.benchmark = True
    cells = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        vae = make_vae("sd15").to("cuda", dtype).eval()
        for size in (int(s) for s in args.sizes.split(",")):
            z = torch.randn(1, 4, size // 8, size // 8, device="cuda", dtype=dtype)
            for layout in ("nchw", "channels_last"):
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                vae.to(memory_format=fmt)
                zz = z.contiguous(memory_format=fmt)
                gpu, wall = [], []
                with torch.no_grad():
                    for _ in range(2):  # warm-up (cudnn.benchmark picks its algorithms here)
                        vae.decode(zz)
                    torch.cuda.synchronize()
                    for _ in range(args.runs):
                        start = torch.cuda.Event(enable_timing=True)
                        end = torch.cuda.Event(enable_timing=True)
                        t = time.perf_counter()
                        start.record()
                        vae.decode(zz)
                        end.record()
                        torch.cuda.synchronize()
                        wall.append((time.perf_counter() - t) * 1e3)
                        gpu.append(start.elapsed_time(end))
                med = lambda v: sorted(v)[len(v) // 2]
                cell = dict(size=size, dtype=dtype_name, layout=layout, runs=args.runs,
                            gpu_ms=med(gpu), wall_ms=med(wall), torch=torch.__version__,
                            device=torch.cuda.get_device_name(0))
                print(json.dumps(cell), flush=True)
                cells.append(cell)
                # Rewritten after every cell: a run stopped at its time limit keeps the rest.
                with open(args.json, "w") as f:
                    json.dump(cells, f, indent=1)
        del vae
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
