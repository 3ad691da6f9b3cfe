#!/usr/bin/env bash
# One-command GPU check: tests, kernel benchmarks, whole decodes, memory and (when
# torch + diffusers import) the PyTorch comparison, on one adapter, into one report
# folder (summary.md / summary.csv on top, one subfolder per stage).
#
#   bench/gpu/run.sh [--quick | --smoke] [--adapter NAME] [--bin DIR | --cargo-profile P]
#                    [--skip STAGES] [--skip-reason TEXT] [--shared DIR] --out DIR
#
#   --quick        small sizes (TAEF2 at 64 and 128 px, the SD1.5 preset at 64 px,
#                  taew2_1 and the tiny Wan VAE at 32 px for 2 latent frames, f32,
#                  one timed decode per cell) and a representative test subset;
#                  CI runs it on lavapipe (about a minute with the tests skipped)
#   --smoke        --quick's smallest cells only: TAEF2 at 64 px (no preset), its
#                  memory predictions without `wgvae report memory`, the quick
#                  video cells; seconds
#   --adapter NAME the adapter (part of its name, as in `wgvae info`); exported as
#                  WGPU_ADAPTER_NAME for tests and benches. The backend comes from
#                  WGPU_BACKEND (vulkan, gl, metal, dx12), e.g. WGPU_BACKEND=vulkan
#   --bin DIR      prebuilt executables from bench/gpu/build_bins.sh DIR (no cargo
#                  needed); without it the script builds with cargo
#   --cargo-profile P  build with that cargo profile (default release); `dev`
#                  reuses what `cargo test` built (CI). With kernels skipped only
#                  `wgvae` is built
#   --skip STAGES  comma-separated stages not to run: tests, kernels, decode, memory,
#                  video, diffusers
#   --skip-reason TEXT  why they are skipped, for the report (e.g. CI: "cargo test
#                  ran them in the step before")
#   --shared DIR   the shared test data (default: $WGVAE_SHARED_DIR, else ../shared
#                  beside the project)
#   --out DIR      the report folder (created)
#
# Stages: (a) tests  (b) kernels: criterion conv2d / GroupNorm / attention suites
# (c) decode: `wgvae bench decode` untiled and exact-tiled (d) memory: the estimator's
# prediction per decode cell against the peak the decode measured, and `wgvae report
# memory` (with --measure unless --quick) (e) video: `wgvae bench video` for taew2_1
# (TAEHV) and the Wan 2.1 VAE, `wgvae memory --frames` beside each row's measured peak,
# and bench/compare_video.py when torch imports (TAEHV_PY=path/to/taehv.py adds the
# taehv.py peers) (f) diffusers: bench/compare_diffusers.py per preset cell. A failing stage does not stop the others;
# the script exits 1 when any stage failed.
set -uo pipefail

usage() { sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; }

quick=0
smoke=0
adapter=
bin=
skip=
skip_reason=
cargo_profile=
shared=${WGVAE_SHARED_DIR:-}
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --smoke) quick=1; smoke=1 ;;
    --adapter) adapter=${2:?--adapter needs a name}; shift ;;
    --bin) bin=${2:?--bin needs a folder}; shift ;;
    --skip) skip=${2:?--skip needs stages}; shift ;;
    --skip-reason) skip_reason=${2:?--skip-reason needs a text}; shift ;;
    --cargo-profile) cargo_profile=${2:?--cargo-profile needs a profile}; shift ;;
    --shared) shared=${2:?--shared needs a folder}; shift ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ -n "$out" ] || { echo "run.sh: --out DIR is required" >&2; usage >&2; exit 2; }
for s in ${skip//,/ }; do
  case "$s" in tests|kernels|decode|memory|video|diffusers) ;;
    *) echo "run.sh: unknown stage in --skip: $s" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/../.." && pwd)
skipped() { case ",$skip," in *",$1,"*) return 0 ;; esac; return 1; }
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
cd "$root"

# Tests and benches read ../shared and the project tree (see wgvae::testing).
if [ -z "$shared" ] && [ -f "$root/../shared/README.md" ]; then shared=$root/../shared; fi
if [ -n "$shared" ]; then
  if [ -f "$shared/README.md" ]; then
    shared=$(cd "$shared" && pwd)
    export WGVAE_SHARED_DIR=$shared
  else
    echo "run.sh: $shared has no README.md: not the shared test data" >&2
    exit 2
  fi
fi
export WGVAE_PROJECT_DIR=$root
if [ -n "$adapter" ]; then export WGPU_ADAPTER_NAME=$adapter; fi
adapter_args=()
if [ -n "$adapter" ]; then adapter_args=(--adapter "$adapter"); fi

# Executables: prebuilt (--bin) or built here (symlinked into a temporary folder).
if [ -n "$bin" ]; then
  bin=$(cd "$bin" && pwd) || exit 2
  [ -x "$bin/wgvae" ] || { echo "run.sh: $bin/wgvae missing (bench/gpu/build_bins.sh DIR makes it)" >&2; exit 2; }
  mode=prebuilt
else
  mode=cargo
  bin=$(mktemp -d)
  trap 'rm -rf "$bin"' EXIT
  build_args=(--link --no-tests)
  [ -n "$cargo_profile" ] && build_args+=(--profile "$cargo_profile")
  skipped kernels && build_args+=(--no-benches)
  echo "run.sh: building (build_bins.sh ${build_args[*]}) ..."
  if ! "$root/bench/gpu/build_bins.sh" "${build_args[@]}" "$bin" >"$out/logs/build.log" 2>&1; then
    echo "run.sh: build failed, see $out/logs/build.log" >&2
    tail -20 "$out/logs/build.log" >&2
    exit 1
  fi
fi
wgvae=$bin/wgvae
# Integration tests run this CLI (wgvae::testing::wgvae_bin) when given.
[ "$mode" = prebuilt ] && export WGVAE_BIN=$wgvae

# ---------------------------------------------------------------- settings
taef2=${shared:+$shared/weights/taef2/decoder.safetensors}
presets=(sd15 sdxl flux1)
if [ "$quick" = 1 ]; then
  # One preset: generating and uploading SDXL/FLUX.1's seeded weights dominates a quick run on a CPU.
  presets=(sd15)
  taef2_sizes=64,128
  preset_sizes=64
  dtypes=f32
  tile_px=32
  warmup=0
  runs=1
  conv_shapes=${WGVAE_BENCH_CONV_SHAPES:-64x32x32->64}
  norm_shapes=${WGVAE_BENCH_NORM_SHAPES:-64x32x32}
  attn_tokens=${WGVAE_ATTN_TOKENS:-256}
  bench_naive=${WGVAE_BENCH_NAIVE:-0}
  criterion_args=(--warm-up-time 0.1 --measurement-time 0.5)
  # Video: the smallest sizes the decoders take, 2 latent frames (5 frames with Wan's
  # causal first frame, 8 with TAEHV's).
  video_size=64  # LTX-2's reflect padding needs 2 latent pixels (32× per pixel)
  video_frames=2
  video_chunks=1
  video_dtypes=f32
  # The AutoencoderKL goldens (diffusers) on the adapter: representative and quick.
  quick_tests=(decode_goldens)
  quick_filter=aekl_tiny
else
  taef2_sizes=512,1024
  preset_sizes=512,1024
  dtypes=f32,f16,bf16
  tile_px=256
  warmup=1
  runs=3
  conv_shapes=${WGVAE_BENCH_CONV_SHAPES:-512x64x64->512,256x128x128->256,128x256x256->128,512x128x128->512,256x256x256->256,128x512x512->128}
  norm_shapes=${WGVAE_BENCH_NORM_SHAPES:-512x64x64,256x128x128,128x256x256,512x128x128,256x256x256,128x512x512}
  attn_tokens=${WGVAE_ATTN_TOKENS:-1024,4096,16384}
  bench_naive=${WGVAE_BENCH_NAIVE:-}
  criterion_args=()
  # Video: about 480×832's pixel count (square: the bench decodes square videos),
  # 3 and 6 latent frames (Wan: 9 and 21 frames), streamed 1 latent frame a chunk.
  video_size=640
  video_frames=3,6
  video_chunks=1
  video_dtypes=f32,f16,bf16
  quick_tests=()
  quick_filter=
fi
if [ "$smoke" = 1 ]; then
  # Each stage's smallest cell: the quickest check that every stage still runs.
  presets=()
  taef2_sizes=64
fi

# ---------------------------------------------------------------- header
info_json=$out/adapter.json
"$wgvae" "${adapter_args[@]}" info --json >"$info_json" 2>"$out/logs/info.log"
info_rc=$?
# A field of the chosen adapter from `wgvae info --json`.
chosen() {
  if command -v python3 >/dev/null; then
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])).get("chosen") or {}; print(c.get(sys.argv[2], ""))' "$info_json" "$1" 2>/dev/null
  else
    sed -n 's/.*"chosen":{\(.*\)/\1/p' "$info_json" | grep -o "\"$1\":\"[^\"]*\"" | head -1 | cut -d'"' -f4
  fi
}
adapter_name=$(chosen name)
backend=$(chosen backend)
driver=$(chosen driver)
driver_info=$(chosen driver_info)
device_type=$(chosen type)
features=$(chosen features)
# The cooperative-matrix configuration f16 models run on (empty: the scalar path only).
matrix_used=
if command -v python3 >/dev/null; then
  matrix_used=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])).get("chosen") or {}; print((c.get("cooperative_matrix") or {}).get("used") or "")' "$info_json" 2>/dev/null)
fi
commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || true)
if [ -n "$commit" ] && ! git -C "$root" diff --quiet HEAD 2>/dev/null; then commit="$commit (uncommitted changes)"; fi
if [ -z "$commit" ] && [ -f "$bin/BUILD_INFO" ]; then commit=$(sed -n 's/^commit: //p' "$bin/BUILD_INFO"); fi
wgvae_version=$("$wgvae" --version 2>/dev/null | awk '{print $2}')
wgpu_version=$(sed -n '/^name = "wgpu"$/{n;s/^version = "\(.*\)"/\1/p}' "$root/Cargo.lock" 2>/dev/null)
if [ -f "$bin/BUILD_INFO" ]; then rustc_version=$(sed -n 's/^rustc: //p' "$bin/BUILD_INFO"); else rustc_version=$(rustc --version 2>/dev/null); fi
gpu_driver=
if command -v nvidia-smi >/dev/null; then
  gpu_driver=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
fi
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || true)

# ---------------------------------------------------------------- stages
declare -a st_name st_status st_secs st_note
failed=0

# run_stage NAME FUNCTION: runs it with output in logs/NAME.log; the function may set
# `note` and return 0 (pass), 1 (fail) or 3 (skipped, `note` says why).
run_stage() {
  local name=$1 fn=$2 t0 t1 rc
  note=
  if skipped "$name"; then
    st_name+=("$name"); st_status+=(skipped); st_secs+=(0); st_note+=("--skip $name${skip_reason:+: $skip_reason}")
    echo "== $name: skipped (--skip)"
    return
  fi
  echo "== $name ..."
  t0=$(date +%s.%N)
  "$fn" >"$out/logs/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  local status=pass
  if [ "$rc" = 3 ]; then status=skipped; elif [ "$rc" != 0 ]; then status=fail; failed=1; fi
  [ -f "$out/logs/$name.note" ] && note=$(cat "$out/logs/$name.note") && rm -f "$out/logs/$name.note"
  st_name+=("$name"); st_status+=("$status"); st_secs+=("$secs"); st_note+=("$note")
  echo "== $name: $status in ${secs} s${note:+ ($note)}"
}
# Stage functions run with output redirected; they leave a note in logs/NAME.note.
say_note() { echo "$2" >"$out/logs/$1.note"; }

# Parses the test harness's "test result:" lines of a log into totals.
test_totals() {
  awk '/^test result:/ {for (i=1;i<=NF;i++) {if ($(i)~/^passed;?/) p+=$(i-1); if ($(i)~/^failed;?/) f+=$(i-1); if ($(i)~/^ignored;?/) ig+=$(i-1)}}
       /^SKIPPED/ {s++}
       END {printf "%d passed, %d failed, %d ignored, %d skip messages", p, f, ig, s}' "$1"
}

stage_tests() {
  local dir=$out/tests rc=0
  mkdir -p "$dir"
  echo "executable,status,seconds,result" >"$dir/tests.csv"
  if [ "$mode" = cargo ]; then
    local args=()
    for t in "${quick_tests[@]}"; do args+=(--test "$t"); done
    local t0 t1
    t0=$(date +%s)
    cargo test ${cargo_profile:+--profile "$cargo_profile"} "${args[@]}" ${quick_filter:+"$quick_filter"} 2>&1 | tee "$dir/cargo_test.log"
    rc=${PIPESTATUS[0]}
    t1=$(date +%s)
    echo "cargo test ${args[*]},$([ "$rc" = 0 ] && echo pass || echo fail),$((t1 - t0)),\"$(test_totals "$dir/cargo_test.log")\"" >>"$dir/tests.csv"
    say_note tests "cargo test ${args[*]:-(all)} $quick_filter: $(test_totals "$dir/cargo_test.log")"
    return "$rc"
  fi
  [ -d "$bin/tests" ] && [ -n "$(ls "$bin/tests")" ] || { say_note tests "no test executables in $bin/tests"; return 1; }
  local exes=()
  if [ "${#quick_tests[@]}" -gt 0 ]; then exes=("${quick_tests[@]}"); else mapfile -t exes < <(ls "$bin/tests"); fi
  local all=$dir/all.log name
  : >"$all"
  for name in "${exes[@]}"; do
    local exe=$bin/tests/$name t0 t1 r
    echo "--- $name"
    if [ ! -x "$exe" ]; then echo "$name,missing,0,\"\"" >>"$dir/tests.csv"; rc=1; continue; fi
    t0=$(date +%s)
    # cwd = project root, as cargo test runs them.
    (cd "$root" && "$exe" ${quick_filter:+"$quick_filter"}) >"$dir/$name.log" 2>&1
    r=$?
    t1=$(date +%s)
    cat "$dir/$name.log" >>"$all"
    tail -3 "$dir/$name.log"
    [ "$r" = 0 ] || rc=1
    echo "$name,$([ "$r" = 0 ] && echo pass || echo fail),$((t1 - t0)),\"$(test_totals "$dir/$name.log")\"" >>"$dir/tests.csv"
  done
  say_note tests "${#exes[@]} test executables${quick_filter:+ (filter $quick_filter)}: $(test_totals "$all") (doc tests need cargo)"
  return "$rc"
}

# Criterion's "name / time: [lo mid hi]" blocks as CSV rows.
criterion_csv() {
  awk 'BEGIN {print "benchmark,time_low,time_median,time_high,unit"}
       /^[^ ].*/ && !/^(Benchmarking|Found|Warning|RESULT|SUMMARY|adapter|attention|note|Gnuplot)/ {name=$1}
       /^[^ ].* +time: +\[/ {name=$1}
       /time: +\[/ {sub(/.*time: +\[/, ""); sub(/\].*/, ""); print name "," $1 "," $3 "," $5 "," $2}' "$1"
}

stage_kernels() {
  local dir=$out/kernels rc=0 r
  mkdir -p "$dir"
  export CRITERION_HOME=$dir/criterion
  for suite in kernels attention; do
    local exe=$bin/benches/$suite
    [ -x "$exe" ] || { echo "no $exe"; rc=1; continue; }
    echo "--- $suite"
    WGVAE_BENCH_CONV_SHAPES=$conv_shapes WGVAE_BENCH_NORM_SHAPES=$norm_shapes \
      WGVAE_ATTN_TOKENS=$attn_tokens WGVAE_BENCH_NAIVE=$bench_naive \
      "$exe" --bench --noplot "${criterion_args[@]}" 2>&1 | tee "$dir/$suite.log"
    r=${PIPESTATUS[0]}
    [ "$r" = 0 ] || rc=1
    criterion_csv "$dir/$suite.log" >"$dir/$suite.csv"
  done
  # The kernels suite's own RESULT lines (GFLOP/s, GB/s) as CSV.
  { echo "kernel,shape,value,unit,line"
    sed -n 's/^RESULT \([^ ]*\) \(.*\): \([0-9.]*\) \(GFLOP\/s\|GB\/s\) median\(.*\)$/\1,"\2",\3,\4,"\3 \4 median\5"/p' "$dir/kernels.log" 2>/dev/null
  } >"$dir/kernels_results.csv"
  say_note kernels "conv $conv_shapes; GroupNorm $norm_shapes; attention tokens $attn_tokens"
  return "$rc"
}

# Cells: "label vae sizes tile" per line.
decode_cells() {
  if [ -n "$taef2" ]; then
    echo "taef2 $taef2 $taef2_sizes off"
    echo "taef2 $taef2 $taef2_sizes exact"
  fi
  for p in "${presets[@]}"; do
    echo "$p preset:$p $preset_sizes off"
    echo "$p preset:$p $preset_sizes exact"
  done
}

# Concatenates the per-cell decode.csv files (their "# key: value" headers dropped)
# into one CSV with model and tile columns in front.
merge_decode_csv() {
  local first=1
  for f in "$out"/decode/*/decode.csv; do
    [ -f "$f" ] || continue
    local cell model tile
    cell=$(basename "$(dirname "$f")")
    model=${cell%_*}
    tile=${cell##*_}
    awk -v m="$model" -v t="$tile" -v first="$first" '
      /^# / {next}
      !h {h=1; if (first) print "model,tile_mode," $0; next}
      NF {print m "," t "," $0}' "$f"
    first=0
  done
}

stage_decode() {
  local dir=$out/decode rc=0 r n=0
  mkdir -p "$dir"
  [ -n "$taef2" ] || echo "no shared data: TAEF2 cells left out (presets need no files)"
  while read -r label vae sizes tile; do
    local cell=$dir/${label}_$tile args=()
    [ "$tile" = exact ] && args=(--tile exact --tile-size "$tile_px")
    [ "$tile" = off ] && args=(--tile off)
    echo "--- $label $sizes $dtypes tile $tile"
    "$wgvae" "${adapter_args[@]}" bench decode --vae "$vae" --sizes "$sizes" --dtypes "$dtypes" \
      --warmup "$warmup" --runs "$runs" "${args[@]}" --out "$cell"
    r=$?
    n=$((n + 1))
    if [ "$r" != 0 ]; then rc=1; echo "FAILED: $label tile $tile (exit $r)"; fi
    # Where f16 runs on cooperative matrices, its cells again on the scalar path
    # (rows labelled MODEL+scalar; decode.csv's matrix column names each path).
    if [ -n "$matrix_used" ] && [[ ",$dtypes," == *,f16,* ]]; then
      echo "--- $label $sizes f16 tile $tile, cooperative matrices off"
      "$wgvae" "${adapter_args[@]}" --cooperative-matrix off bench decode --vae "$vae" --sizes "$sizes" \
        --dtypes f16 --warmup "$warmup" --runs "$runs" "${args[@]}" --out "$dir/${label}+scalar_$tile"
      r=$?
      if [ "$r" != 0 ]; then rc=1; echo "FAILED: $label+scalar tile $tile (exit $r)"; fi
    fi
  done < <(decode_cells)
  merge_decode_csv >"$out/decode.csv"
  # A cell the device cannot run is a row with a reason, not a failure; an error is.
  if grep -v '"ok"' "$out/decode.csv" | grep -q '^[a-z0-9]*,[a-z]*,[0-9]'; then
    echo "cells not ok:"; grep -v '"ok"' "$out/decode.csv" | grep '^[a-z0-9]*,[a-z]*,[0-9]'
  fi
  local paths="cooperative matrices: none on this adapter (scalar path)"
  [ -n "$matrix_used" ] && paths="f16 on cooperative matrices ($matrix_used) and again on the scalar path (MODEL+scalar rows)"
  say_note decode "$n cell groups ($(tail -n +2 "$out/decode.csv" | wc -l) rows): sizes TAEF2 $taef2_sizes, presets ${presets[*]:-none} at $preset_sizes; $dtypes; untiled and exact ${tile_px}-px tiles; warm-up $warmup, runs $runs; $paths"
  return "$rc"
}

# The estimator's prediction for each decoded cell beside the peak that decode
# measured (planned pool, the bench's default), then `wgvae report memory`.
stage_memory() {
  local dir=$out/memory rc=0 mismatches=0 rows=0
  mkdir -p "$dir"
  local csv=$dir/predicted_vs_measured.csv
  echo "model,tile_mode,size,dtype,tiling,predicted_allocated_mib,predicted_reserved_mib,measured_allocated_mib,measured_reserved_mib,agree" >"$csv"
  if [ -f "$out/decode.csv" ]; then
    # Columns of decode.csv by name.
    local header
    header=$(head -1 "$out/decode.csv")
    col() { echo "$header" | tr ',' '\n' | grep -n -x "$1" | cut -d: -f1; }
    local c_size c_dtype c_tiling c_alloc c_res c_status
    c_size=$(col size); c_dtype=$(col dtype); c_tiling=$(col tiling)
    c_alloc=$(col peak_allocated_mib); c_res=$(col peak_reserved_mib); c_status=$(col status)
    while IFS=, read -r -a f; do
      local model=${f[0]} tile=${f[1]} size=${f[$((c_size - 1))]} dtype=${f[$((c_dtype - 1))]}
      local tiling=${f[$((c_tiling - 1))]} alloc=${f[$((c_alloc - 1))]} res=${f[$((c_res - 1))]}
      [ "${f[$((c_status - 1))]}" = '"ok"' ] || continue
      local mm=()
      # MODEL+scalar rows ran with cooperative matrices off: predicted the same way.
      if [[ "$model" == *+scalar ]]; then model=${model%+scalar}; mm=(--cooperative-matrix off); fi
      local vae=preset:$model args=(--tile off)
      [ "$model" = taef2 ] && vae=$taef2
      [ "$tile" = exact ] && args=(--tile exact --tile-size "$tile_px")
      local pred
      pred=$("$wgvae" "${adapter_args[@]}" "${mm[@]}" memory --vae "$vae" --size "${size}x$size" --dtype "$dtype" "${args[@]}" --json 2>>"$dir/memory.log")
      echo "$pred" >>"$dir/memory.log"
      # Bytes to MiB with 2 decimals, as decode.csv has them.
      local pa pr
      pa=$(echo "$pred" | grep -o '"peak_allocated_bytes":[0-9]*' | cut -d: -f2 | awk '{printf "%.2f", $1 / 1048576}')
      pr=$(echo "$pred" | grep -o '"peak_reserved_bytes":[0-9]*' | cut -d: -f2 | awk '{printf "%.2f", $1 / 1048576}')
      local agree=no
      if [ -n "$pa" ] && awk -v a="$pa" -v b="$alloc" -v c="$pr" -v d="$res" 'BEGIN{exit !((a-b)^2 < 0.0001 && (c-d)^2 < 0.0001)}'; then agree=yes; else mismatches=$((mismatches + 1)); fi
      [ -n "$pa" ] || rc=1
      rows=$((rows + 1))
      echo "${f[0]},$tile,$size,$dtype,\"$tiling\",$pa,$pr,$alloc,$res,$agree" >>"$csv"
    done < <(tail -n +2 "$out/decode.csv")
  else
    echo "no decode.csv (decode stage skipped or failed): no per-cell comparison"
  fi
  local report_args=(--this-device --out "$dir/report")
  [ -n "$shared" ] && report_args+=(--reference "$shared/reference/pytorch_vae_memory_rtx4090.csv")
  [ "$quick" = 1 ] || report_args+=(--measure)
  local report_note="report memory ${report_args[*]:0:1}$([ "$quick" = 1 ] || echo ' --measure')"
  if [ "$smoke" = 1 ]; then
    report_note="no report memory (--smoke)"
  else
    echo "--- wgvae report memory ${report_args[*]}"
    "$wgvae" "${adapter_args[@]}" report memory "${report_args[@]}" || rc=1
  fi
  say_note memory "$rows decoded cells predicted: $((rows - mismatches)) equal to the measured peak (MiB, 2 decimals); $report_note"
  [ "$mismatches" = 0 ] || rc=1
  return "$rc"
}

# Video cells: "label vae [latent frames]" per line (weights from ../shared; the full run's
# Wan 2.1 / 2.2, HunyuanVideo 1.5, LTX-2 and MiniMax-H3 are the presets' seeded random weights at
# the real architectures). MiniMax-H3 decodes clips and needs 3 latent frames at least.
video_cells() {
  [ -n "$shared" ] && echo "taew2_1 $shared/golden/taew2_1-rand/taew2_1.safetensors"
  local m
  if [ "$quick" = 1 ]; then
    [ -n "$shared" ] && for m in wan21 wan22 hunyuanvideo15 ltx2; do echo "$m-tiny $shared/golden/$m-tiny"; done
    [ -n "$shared" ] && echo "minimax-h3-tiny $shared/golden/minimax-h3-tiny 3"
  else
    for m in wan21 wan22 hunyuanvideo15 ltx2 minimax-h3; do echo "$m preset:$m"; done
  fi
}

# A CSV column's number (1-based) by name.
csv_col() { echo "$1" | tr ',' '\n' | grep -n -x "$2" | cut -d: -f1; }

# `wgvae bench video` per cell, `wgvae memory --frames` per row against the peak the
# row measured, and bench/compare_video.py when torch imports.
stage_video() {
  local dir=$out/video rc=0 n=0 rows=0 mismatches=0 not_ok=0
  mkdir -p "$dir"
  local cells
  cells=$(video_cells)
  if [ -z "$cells" ]; then
    say_note video "no shared data: the quick video cells need ../shared's taew2_1 and wan21-tiny"
    return 3
  fi
  local pvm=$dir/predicted_vs_measured.csv
  echo "model,dtype,chunk,latent_frames,size,predicted_allocated_mib,predicted_reserved_mib,measured_allocated_mib,measured_reserved_mib,agree" >"$pvm"
  local label vae lengths
  while read -r label vae lengths; do
    local cell=$dir/$label
    lengths=${lengths:-$video_frames}
    echo "--- $label ${video_size}px latent frames $lengths $video_dtypes"
    if ! "$wgvae" "${adapter_args[@]}" bench video --vae "$vae" --size "$video_size" \
        --latent-frames "$lengths" --chunk "$video_chunks" --dtypes "$video_dtypes" \
        --warmup "$warmup" --runs "$runs" --out "$cell"; then
      rc=1; echo "FAILED: $label"; continue
    fi
    n=$((n + 1))
    local header
    header=$(grep -v '^# ' "$cell/video.csv" | head -1)
    local c_dtype c_chunk c_frames c_alloc c_res c_status
    c_dtype=$(csv_col "$header" dtype); c_chunk=$(csv_col "$header" chunk)
    c_frames=$(csv_col "$header" latent_frames); c_status=$(csv_col "$header" status)
    c_alloc=$(csv_col "$header" peak_allocated_mib); c_res=$(csv_col "$header" peak_reserved_mib)
    local f
    while IFS=, read -r -a f; do
      local dtype=${f[$((c_dtype - 1))]} chunk=${f[$((c_chunk - 1))]} frames=${f[$((c_frames - 1))]}
      local alloc=${f[$((c_alloc - 1))]} res=${f[$((c_res - 1))]}
      # A row the device cannot run (e.g. over its binding limit) has a reason, not a failure.
      [ "${f[$((c_status - 1))]}" = '"ok"' ] || { echo "row not ok: ${f[*]}"; not_ok=$((not_ok + 1)); continue; }
      local pred pa pr agree=no
      pred=$("$wgvae" "${adapter_args[@]}" memory --vae "$vae" --size "${video_size}x$video_size" \
        --dtype "$dtype" --frames "$frames" --chunk "$chunk" --json 2>>"$dir/memory.log")
      echo "$pred" >>"$dir/memory.log"
      pa=$(echo "$pred" | grep -o '"peak_allocated_bytes":[0-9]*' | cut -d: -f2 | awk '{printf "%.2f", $1 / 1048576}')
      pr=$(echo "$pred" | grep -o '"peak_reserved_bytes":[0-9]*' | cut -d: -f2 | awk '{printf "%.2f", $1 / 1048576}')
      if [ -n "$pa" ] && awk -v a="$pa" -v b="$alloc" -v c="$pr" -v d="$res" 'BEGIN{exit !((a-b)^2 < 0.0001 && (c-d)^2 < 0.0001)}'; then agree=yes; else mismatches=$((mismatches + 1)); fi
      [ -n "$pa" ] || rc=1
      rows=$((rows + 1))
      echo "$label,$dtype,$chunk,$frames,$video_size,$pa,$pr,$alloc,$res,$agree" >>"$pvm"
    done < <(grep -v '^# ' "$cell/video.csv" | tail -n +2)
  done <<<"$cells"
  # One CSV of every cell's rows (their "# key: value" headers dropped).
  local first=1 f
  for f in "$dir"/*/video.csv; do
    [ -f "$f" ] || continue
    grep -v '^# ' "$f" | awk -v first="$first" 'NR == 1 {if (first) print; next} NF'
    first=0
  done >"$out/video.csv"
  local peers="no PyTorch peers (torch does not import)"
  if python3 -c "import torch" 2>"$dir/import.log"; then
    local device
    device=$(python3 -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
    peers="PyTorch peers on torch $device (bench/compare_video.py, ${video_dtypes%%,*}${TAEHV_PY:+, taehv.py $TAEHV_PY})"
    while read -r label vae lengths; do
      echo "--- compare_video.py $label on $device"
      python3 "$root/bench/compare_video.py" --vae "$vae" --size "$video_size" \
        --latent-frames "${lengths:-$video_frames}" --chunk "${video_chunks%%,*}" --dtype "${video_dtypes%%,*}" \
        --device "$device" --warmup "$warmup" --runs "$runs" --wgvae "$wgvae" \
        ${TAEHV_PY:+--taehv-py "$TAEHV_PY"} --out "$dir/compare_$label" || rc=1
    done <<<"$cells"
  fi
  local own
  own=$(echo "$cells" | awk 'NF > 2 {printf "%s%s: %s", (n++ ? ", " : ""), $1, $3}')
  say_note video "$n of $(echo "$cells" | wc -l) video cells ($(echo "$cells" | awk '{printf "%s%s", (NR > 1 ? ", " : ""), $1}')) at ${video_size}x${video_size}, latent frames $video_frames${own:+ ($own)}, chunk $video_chunks, $video_dtypes; $not_ok rows not ok (reasons in video.csv); $rows rows predicted by wgvae memory --frames: $((rows - mismatches)) equal to the measured peak; $peers"
  [ "$mismatches" = 0 ] || rc=1
  return "$rc"
}

stage_diffusers() {
  local dir=$out/diffusers rc=0
  mkdir -p "$dir"
  if ! python3 -c "import torch, diffusers" 2>"$dir/import.log"; then
    say_note diffusers "torch/diffusers do not import here: no PyTorch comparison"
    return 3
  fi
  local device
  device=$(python3 -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
  echo "model,size,dtype,torch_device,diffusers_ms,wgvae_ms,ratio_wgvae_over_diffusers,status" >"$out/diffusers.csv"
  local sizes=${preset_sizes//,/ } n=0
  for p in "${presets[@]}"; do
    for s in $sizes; do
      for d in ${dtypes//,/ }; do
        local td
        td=$(case $d in f32) echo float32 ;; f16) echo float16 ;; bf16) echo bfloat16 ;; esac)
        echo "--- $p $s $d on $device"
        local js=$dir/${p}_${s}_$d.json
        if python3 "$root/bench/compare_diffusers.py" --preset "$p" --size "$s" --dtype "$td" \
            --device "$device" --runs "$runs" --wgvae "$wgvae" --json "$js"; then
          python3 - "$js" "$p" "$s" "$d" "$device" >>"$out/diffusers.csv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]},{sys.argv[3]},{sys.argv[4]},{sys.argv[5]},{r['diffusers_ms']:.2f},{r['wgvae_ms']:.2f},{r['ratio']:.3f},ok")
PY
        else
          rc=1
          echo "$p,$s,$d,$device,,,,failed" >>"$out/diffusers.csv"
        fi
        n=$((n + 1))
      done
    done
  done
  say_note diffusers "$n preset cells (untiled) on torch $device; TAEF2 has no diffusers counterpart here"
  return "$rc"
}

run_stage tests stage_tests
run_stage kernels stage_kernels
run_stage decode stage_decode
run_stage memory stage_memory
run_stage video stage_video
run_stage diffusers stage_diffusers

# ---------------------------------------------------------------- summary
{
  echo "stage,status,seconds,note"
  for i in "${!st_name[@]}"; do
    echo "${st_name[$i]},${st_status[$i]},${st_secs[$i]},\"${st_note[$i]//\"/\'}\""
  done
} >"$out/summary.csv"

md_table() { # CSV -> Markdown table (commas inside quoted fields kept; POSIX awk)
  awk 'function row(line,   out, f, q, i, c) {
         out = "|"; f = ""; q = 0
         for (i = 1; i <= length(line); i++) {
           c = substr(line, i, 1)
           if (c == "\"") q = !q
           else if (c == "," && !q) { out = out " " f " |"; f = "" }
           else f = f c
         }
         return out " " f " |"
       }
       NR == 1 {print row($0); h = "|"; n = split($0, a, ","); for (i = 1; i <= n; i++) h = h "---|"; print h; next}
       {print row($0)}' "$1"
}

{
  echo "# wgvae GPU check$([ "$smoke" = 1 ] && echo ' (smoke)' || { [ "$quick" = 1 ] && echo ' (quick)'; })"
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| adapter | ${adapter_name:-unknown (wgvae info failed: logs/info.log)} |"
  echo "| device type | $device_type |"
  echo "| backend | $backend |"
  echo "| driver | $driver $driver_info |"
  [ -n "$gpu_driver" ] && echo "| nvidia-smi | $gpu_driver |"
  echo "| features | $features |"
  echo "| wgvae | $wgvae_version ($mode executables) |"
  echo "| wgpu | $wgpu_version |"
  echo "| rustc | $rustc_version |"
  echo "| commit | $commit |"
  echo "| started (UTC) | $started, load average $load |"
  echo "| host | $(uname -srm), $(nproc 2>/dev/null) CPUs |"
  echo "| WGPU_BACKEND / WGPU_ADAPTER_NAME | ${WGPU_BACKEND:-(all)} / ${WGPU_ADAPTER_NAME:-(auto)} |"
  echo "| shared data | ${shared:-(none: tests needing it skip)} |"
  echo
  echo "## Stages"
  echo
  md_table "$out/summary.csv"
  for t in decode.csv memory/predicted_vs_measured.csv video.csv video/predicted_vs_measured.csv kernels/kernels_results.csv kernels/attention.csv diffusers.csv tests/tests.csv; do
    [ -f "$out/$t" ] || continue
    echo
    echo "## $t"
    echo
    if [ "$t" = kernels/kernels_results.csv ]; then
      cut -d, -f1-4 "$out/$t" | { read -r _; echo "kernel,shape,value,unit"; cat; } >"$out/logs/k.csv"
      md_table "$out/logs/k.csv"; rm -f "$out/logs/k.csv"
    else
      md_table "$out/$t"
    fi
  done
  echo
  echo "SVG plots: decode/*/decode_time.svg, decode_memory.svg; memory/report/*.svg; video/*/video_memory.svg, video_throughput.svg. Logs: logs/, tests/."
} >"$out/summary.md"
cp "$info_json" "$out/logs/" 2>/dev/null

echo
echo "report: $out/summary.md"
cat "$out/summary.csv"
[ "$info_rc" = 0 ] || { echo "wgvae info failed (no adapter?)" >&2; exit 1; }
exit "$failed"
