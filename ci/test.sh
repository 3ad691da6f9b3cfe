#!/usr/bin/env bash
# The test line, as named steps. README's test command runs them all (`ci/test.sh`); one or more
# can run alone: `ci/test.sh python`, `ci/test.sh check docs`. `ci/test.sh --list` names them.
# Each step prints its name and time; a failing step is named and the script stops there.
# Steps (in order):
#   check    the library builds without the CLI (no default features)
#   docs     rustdoc with warnings as errors (broken links, bad examples)
#   tests    every Rust unit, integration and doc test on Vulkan (lavapipe on CPU machines)
#   gl       the golden suites and kernel tests on wgpu's GL backend (llvmpipe), one thread
#   python   the Python package in a venv under target/ (numpy, pytest, ray[data], imageio-ffmpeg) and its
#            tests, then tests/video_out.rs (--video-out .mp4/.gif/.webm) with imageio-ffmpeg's ffmpeg
#   coopmat  the cooperative-matrix (tensor-core) path in a Debian sid chroot (ci/coopmat.sh)
#   gpu-kit  the GPU kit's --quick run (bench/gpu/run.sh) on whatever adapter is here
set -euo pipefail
cd "$(dirname "$0")/.."

all=(check docs tests gl python coopmat gpu-kit)

step_check() { cargo check --workspace --lib --no-default-features; }
step_docs() { RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps; }
step_tests() { cargo test --workspace; }
step_gl() {
  # wgpu's GL backend panics when two threads create pipelines at once: one test at a time.
  WGPU_BACKEND=gl cargo test --workspace --test decode_goldens --test encode_goldens \
    --test video_goldens --test video_encode -- --test-threads=1
  WGPU_BACKEND=gl cargo test --workspace --lib kernels:: -- --test-threads=1
}
step_python() {
  # --workspace: the extension links against the library the tests built (one feature resolution).
  cargo build --workspace --lib --tests
  python3 -m venv target/pyenv
  target/pyenv/bin/pip install -q uv
  # imageio-ffmpeg: a static ffmpeg (no system ffmpeg in CI) for write_video and --video-out .mp4/.gif.
  target/pyenv/bin/uv pip install -q --python target/pyenv/bin/python numpy pytest "ray[data]" imageio-ffmpeg
  target/pyenv/bin/python python/develop.py
  WGVAE_REQUIRE_FFMPEG=1 target/pyenv/bin/python -m pytest -q python/tests
  # The CLI's --video-out through that ffmpeg (the tests step skipped it: no ffmpeg there).
  WGVAE_REQUIRE_FFMPEG=1 \
    WGVAE_FFMPEG="$(target/pyenv/bin/python -c 'import imageio_ffmpeg; print(imageio_ffmpeg.get_ffmpeg_exe())')" \
    cargo test --workspace --test video_out
}
step_coopmat() { ci/coopmat.sh; }
step_gpu-kit() {
  bench/gpu/run.sh --quick --cargo-profile dev --skip tests \
    --skip-reason "cargo test --workspace ran them" --out target/gpu-quick
}

if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${all[@]}"
  exit 0
fi
steps=("$@")
[ "${#steps[@]}" -gt 0 ] || steps=("${all[@]}")
for s in "${steps[@]}"; do
  if ! declare -F "step_$s" >/dev/null; then
    echo "ci/test.sh: no step \`$s\`; steps: ${all[*]}" >&2
    exit 2
  fi
done

total=$(date +%s)
for s in "${steps[@]}"; do
  echo "==> step $s"
  t=$(date +%s)
  # Not `if ! step`: errexit is off inside a function called as a condition.
  set +e
  (set -e; "step_$s")
  rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "==> step $s FAILED (exit $rc) after $(($(date +%s) - t)) s" >&2
    exit "$rc"
  fi
  echo "==> step $s passed in $(($(date +%s) - t)) s"
done
echo "==> ${#steps[@]} step(s) passed in $(($(date +%s) - total)) s: ${steps[*]}"
