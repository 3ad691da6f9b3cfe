#!/usr/bin/env bash
# The GPU session's one prepared run: what the convolution tiles do on this adapter and how the
# whole SD1.5 decode compares with diffusers on the same GPU, in one call that fits a
# device lease (about 8 minutes on an H100), each stage under `timeout` and writing into the
# report folder as it goes, a summary table last.
#
#   bench/gpu/tune.sh [--dry] [--bin DIR] [--cargo-profile P] [--budget SECONDS] --out DIR
#
#   --dry            tiny sizes on whatever adapter is here (CI: lavapipe): every stage runs
#                    and writes its files, in about a minute after the build
#   --bin DIR        a folder holding a prebuilt `wgvae` and, for the verify stage, the
#                    library's test executable `tests/lib` (bench/gpu/build_bins.sh); without
#                    it `wgvae` is built with cargo and the verify stage does not run
#   --cargo-profile P  the cargo profile to build with (default release; CI: dev)
#   --budget S       seconds for all stages together (default 480, 1500 with --dry); each
#                    stage gets its share and is stopped at it, later stages still run
#   --out DIR        the report folder (created): info.json, conv/ (conv.csv, conv.md,
#                    conv.json), decode/ (per size: wgvae's --json with its GPU profile),
#                    diffusers.json, summary.md, logs/
#
# Stages: (1) `wgvae info --json` (2) verify: the cooperative kernel tests (probes, every
# conv tile set against the CPU reference) on this adapter's matrices (3) `wgvae bench conv`:
# every candidate tile set on the three heaviest layer classes of the SD1.5 decoder at 1024²,
# the best three and the table's entries on the others (4) `wgvae decode --profile --json` of the SD1.5 preset in f16 at 512²
# and 1024², one process per decode (the first finds the pipeline cache as the run left it,
# the others warm): GPU time per kernel beside the wall time, and `wgvae bench decode`'s warm
# medians (5) diffusers on the same GPU (bench/gpu/diffusers_time.py: cudnn.benchmark,
# NCHW and channels_last, CUDA-event GPU time beside wall time) when torch sees CUDA and
# diffusers imports (wheels in .whl/ are installed to /tmp/site first when it does not).
set -uo pipefail

dry=0
bin=
cargo_profile=release
budget=
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) dry=1 ;;
    --bin) bin=${2:?--bin needs a folder}; shift ;;
    --cargo-profile) cargo_profile=${2:?--cargo-profile needs a profile}; shift ;;
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tune.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$out" ] || { echo "tune.sh: --out DIR is required" >&2; exit 2; }
# --dry exercises the stages on a CPU adapter, where compiling the kernels dominates: a
# generous budget (its stages still stop at their shares of it).
[ -n "$budget" ] || { [ "$dry" = 1 ] && budget=1500 || budget=480; }
case "$budget" in *[!0-9]*) echo "tune.sh: --budget takes whole seconds" >&2; exit 2 ;; esac

root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
if [ -n "$bin" ]; then
  [ -d "$bin" ] || { echo "tune.sh: --bin $bin is not a folder" >&2; exit 2; }
  bin=$(cd "$bin" && pwd)
fi
cd "$root"
started=$(date +%s)
say() { echo "tune [$(($(date +%s) - started)) s]: $*" | tee -a "$out/logs/tune.log" >&2; }

if [ -n "$bin" ]; then
  wgvae=$bin/wgvae
else
  say "building wgvae ($cargo_profile)"
  cargo build -q --profile "$cargo_profile" --bin wgvae || exit 1
  dir=$cargo_profile; [ "$dir" = dev ] && dir=debug
  wgvae=$root/target/$dir/wgvae
fi
[ -x "$wgvae" ] || { echo "tune.sh: no wgvae executable at $wgvae" >&2; exit 1; }

if [ "$dry" = 1 ]; then
  conv_sizes=64; decode_sizes="64"; conv_runs=2; decode_runs=1; diff_sizes=64
else
  conv_sizes=1024; decode_sizes="512 1024"; conv_runs=7; decode_runs=3; diff_sizes=512,1024
fi

# Each stage: name, share of the budget in percent, command. Its output goes to logs/NAME.log,
# its status (ok / failed (rc) / timed out / not run: why) to the summary.
status=()
stage() { # NAME PERCENT CMD...
  local name=$1 share=$2; shift 2
  local left=$((budget - ($(date +%s) - started)))
  local limit=$((budget * share / 100))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    status+=("$name|not run: the budget was spent")
    say "$name: not run (budget spent)"
    return
  fi
  say "$name: up to $limit s"
  local t=$(date +%s)
  # Through bash -c: the stages are this script's functions (exported below) or commands.
  timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" >"$out/logs/$name.log" 2>&1
  local rc=$?
  local took=$(($(date +%s) - t))
  case $rc in
    0) status+=("$name|ok ($took s)") ;;
    124|137) status+=("$name|timed out after $took s (partial output kept)") ;;
    3) status+=("$name|not run: $(tail -1 "$out/logs/$name.log")") ;;
    *) status+=("$name|failed (exit $rc) after $took s: $(tail -1 "$out/logs/$name.log")") ;;
  esac
  say "$name: ${status[-1]#*|}"
}

stage info 3 sh -c "\"$wgvae\" info --json > \"$out/info.json\""

# The cooperative kernels' tests on this adapter's matrices (16 × 16 on NVIDIA and AMD: no CPU
# machine runs those tiles) before anything is timed: every table entry and bench candidate
# against the CPU reference. Needs the library's test executable beside wgvae (--bin DIR with
# tests/lib, from bench/gpu/build_bins.sh).
verify() {
  if [ -z "$bin" ] || [ ! -x "$bin/tests/lib" ]; then
    echo "no test executable: --bin DIR/tests/lib (bench/gpu/build_bins.sh) runs the cooperative kernel tests"
    return 3
  fi
  WGVAE_COOPERATIVE_MATRIX=on WGVAE_REQUIRE_COOP=1 "$bin/tests/lib" kernels::coop_probe \
    kernels::conv2d::matrix_tests --test-threads=2
}
export bin
export -f verify
stage verify 12 verify

stage conv 40 "$wgvae" bench conv --sizes "$conv_sizes" --dtype f16 --runs "$conv_runs" \
  --out "$out/conv"

# A seeded standard-normal SD1.5 latent per size, written with the standard library alone.
latent() { # SIZE FILE
  python3 - "$1" "$2" <<'EOF'
import random, struct, sys
s, path = int(sys.argv[1]) // 8, sys.argv[2]
rng = random.Random(0)
vals = [rng.gauss(0.0, 1.0) for _ in range(4 * s * s)]
header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4, %d, %d), }" % (s, s)
header += " " * (63 - (len(header) + 10) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    f.write(struct.pack("<%df" % len(vals), *vals))
EOF
}
decode_cells() {
  mkdir -p "$out/decode"
  for s in $decode_sizes; do
    latent "$s" "$out/decode/latent_$s.npy" || return 1
    # The first decode compiles the pipelines (the cold figure); the last runs are warm.
    for r in $(seq 0 "$decode_runs"); do
      "$wgvae" decode "$out/decode/latent_$s.npy" --vae preset:sd15 --dtype f16 --profile --json \
        -o "$out/decode/sd15_${s}.png" > "$out/decode/sd15_${s}_run$r.json" || return 1
    done
    rm -f "$out/decode/latent_$s.npy" "$out/decode/sd15_${s}.png"
  done
  # Warm medians in one process (upload and RGBA read-back included).
  "$wgvae" bench decode --vae preset:sd15 --sizes "$(echo $decode_sizes | tr ' ' ,)" --dtypes f16 \
    --tile off --runs "$((decode_runs + 2))" --out "$out/decode/bench"
}
diffusers_cells() {
  if ! python3 -c 'import diffusers' 2>/dev/null && ls "$root"/.whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$root"/.whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  if ! python3 -c 'import torch, diffusers' 2>/dev/null; then
    echo "torch or diffusers does not import here"
    return 3
  fi
  PYTHONUNBUFFERED=1 python3 bench/gpu/diffusers_time.py --sizes "$diff_sizes" --dtypes float16 \
    --runs 5 --json "$out/diffusers.json"
}
export out wgvae root decode_sizes decode_runs diff_sizes
export -f latent decode_cells diffusers_cells
stage decode 22 decode_cells
stage diffusers 22 diffusers_cells

# The summary: stage status, the conv classes (default vs best), wgvae's decode (GPU and wall)
# beside diffusers'.
python3 - "$out" "$dry" "${status[@]}" > "$out/summary.md" <<'EOF'
import glob, json, os, re, sys
out, dry, statuses = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
print("# tune.sh summary" + (" (--dry)" if dry else ""))
try:
    info = json.load(open(os.path.join(out, "info.json")))
    chosen = info.get("chosen") or info
    print(f"\nadapter: {json.dumps(chosen)[:400]}")
except Exception as e:
    print(f"\nadapter: info.json unreadable ({e})")
print("\n| stage | status |\n|---|---|")
for s in statuses:
    name, _, st = s.partition("|")
    print(f"| {name} | {st} |")
try:
    conv = json.load(open(os.path.join(out, "conv", "conv.json")))
    print("\n## Convolution classes (ms per call, GPU time)\n")
    print("| size | class | calls | default | ms | TFLOP/s | best | ms | TFLOP/s |\n|---|---|---|---|---|---|---|---|---|")
    for r in conv["summary"]:
        print(f"| {r['size']} | {r['class']} | {r['calls']} | {r['default_tiles']} | {r['default_ms']:.3f} | "
              f"{r['default_tflops']:.2f} | {r['best_tiles']} | {r['best_ms']:.3f} | {r['best_tflops']:.2f} |")
except Exception as e:
    print(f"\nconv: no report ({e})")
print("\n## SD1.5 decode, f16\n")
print("wgvae: `wgvae decode --profile --json`, one process per decode (the first with the pipeline cache as the")
print("run found it, the others warm); decode ms is upload + record + GPU + read-back, GPU ms the sum of the")
print("dispatches' timestamps. Warm in-process medians: decode/bench/decode.md. diffusers: CUDA events around")
print("`vae.decode`, cudnn.benchmark on, median of 5 after 2 warm-ups.\n")
print("| size | wgvae first decode ms | decode ms | GPU ms | conv ms | attention ms | diffusers GPU ms (NCHW / channels_last) | wgvae GPU / best diffusers |")
print("|---|---|---|---|---|---|---|---|")
diff = []
try:
    diff = json.load(open(os.path.join(out, "diffusers.json")))
except Exception:
    pass
sizes = sorted({int(m.group(1)) for p in glob.glob(os.path.join(out, "decode", "sd15_*_run*.json"))
                for m in [re.search(r"sd15_(\d+)_run", p)] if m})
for s in sizes:
    runs = []
    for p in sorted(glob.glob(os.path.join(out, "decode", f"sd15_{s}_run*.json"))):
        try:
            runs.append(json.load(open(p)))
        except Exception:
            pass
    if not runs:
        continue
    def wall(j):
        return j.get("decode_ms", float("nan"))
    def gpu(j, kernel=None):
        prof = j.get("profile") or {}
        if kernel is None:
            return prof.get("gpu_ms", float("nan"))
        return sum(k["total_ms"] for k in prof.get("kernels", []) if k["kernel"].startswith(kernel))
    warm = runs[1:] or runs
    med = lambda v: sorted(v)[len(v) // 2]
    g = med([gpu(j) for j in warm])
    d = [c for c in diff if c["size"] == s]
    dtxt = " / ".join(f"{c['gpu_ms']:.1f}" for c in d) or "-"
    best = min((c["gpu_ms"] for c in d), default=None)
    ratio = f"{g / best:.2f}" if best else "-"
    print(f"| {s} | {wall(runs[0]):.1f} | {med([wall(j) for j in warm]):.1f} | {g:.1f} | "
          f"{med([gpu(j, 'conv2d') for j in warm]):.1f} | {med([gpu(j, 'attention') for j in warm]):.1f} | {dtxt} | {ratio} |")
EOF
cat "$out/summary.md"
say "done"
for s in "${status[@]}"; do
  case "${s#*|}" in ok*|"not run"*) ;; *) exit 1 ;; esac
done
exit 0
