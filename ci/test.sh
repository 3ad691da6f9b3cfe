#!/usr/bin/env bash
# The test line, as named steps. README's test command runs them all (`ci/test.sh`); one or more
# can run alone: `ci/test.sh python`, `ci/test.sh check docs`. `ci/test.sh --list` names them.
# Each step prints its name and time; a failing step is named and the script stops there.
# Steps (in order):
#   check    the library builds without the CLI (no default features)
#   docs     rustdoc with warnings as errors (broken links, bad examples)
#   tests    every Rust unit, integration and doc test on Vulkan (lavapipe on CPU machines)
#   gl       the golden suites and kernel tests on wgpu's GL backend (llvmpipe), one thread
#   python   maturin builds the abi3 wheel (dev profile); a fresh venv installs it from the file
#            (numpy, pytest, ray[data], imageio-ffmpeg, huggingface_hub beside it), pytest runs python/tests against it,
#            then tests/video_out.rs (--video-out .mp4/.gif/.webm) with imageio-ffmpeg's ffmpeg
#   package  packaging checks: `cargo package --list` / `--no-verify` for the crate, the Python sdist,
#            `twine check` of the wheel and the sdist (docs/release.md)
#   coopmat  the cooperative-matrix (tensor-core) path in a Debian sid chroot (ci/coopmat.sh)
#   gpu-kit  the GPU kit's --quick run (bench/gpu/run.sh) and the tuning run's --dry mode
#            (bench/gpu/tune.sh) on whatever adapter is here
set -euo pipefail
cd "$(dirname "$0")/.."

all=(check docs tests gl python package coopmat gpu-kit)

step_check() { cargo check --workspace --lib --no-default-features; }
step_docs() { RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps; }
step_tests() { cargo test --workspace; }
step_gl() {
  # wgpu's GL backend panics when two threads create pipelines at once: one test at a time.
  WGPU_BACKEND=gl cargo test --workspace --test decode_goldens --test encode_goldens \
    --test video_goldens --test video_encode -- --test-threads=1
  WGPU_BACKEND=gl cargo test --workspace --lib kernels:: -- --test-threads=1
}
# The tools (uv, maturin, twine) live in their own venv; the tests' venv is made afresh from the wheel.
tools() {
  [ -x target/pytools/bin/maturin ] && [ -x target/pytools/bin/twine ] && return 0
  python3 -m venv target/pytools
  target/pytools/bin/pip install -q uv
  target/pytools/bin/uv pip install -q --python target/pytools/bin/python "maturin>=1.5,<2" twine
}
step_python() {
  tools
  # A maturin wheel, as users install it; the dev profile (dependencies at opt-level 2, no release
  # build) and stripped. maturin resolves features for the extension alone, so it compiles its own
  # copy of most dependencies beside the tests' (docs/release.md: the time it takes).
  rm -rf target/ci-wheel
  target/pytools/bin/maturin build -q -m python/Cargo.toml --profile dev --strip --out target/ci-wheel
  whl=$(ls target/ci-wheel/wgvae-*.whl)
  case "$whl" in *-cp39-abi3-*) ;; *) echo "not an abi3 (cp39-abi3) wheel: $whl" >&2; return 1 ;; esac
  # A fresh venv: no develop install, no .pth into python/; wgvae comes from the wheel file alone.
  rm -rf target/pyenv
  python3 -m venv target/pyenv
  target/pytools/bin/uv pip install -q --python target/pyenv/bin/python numpy pytest "ray[data]" imageio-ffmpeg huggingface_hub
  t=$(date +%s)
  target/pytools/bin/uv pip install -q --python target/pyenv/bin/python "$whl"
  echo "installed $(basename "$whl") in $(($(date +%s) - t)) s"
  WGVAE_EXPECT_WHEEL=1 WGVAE_REQUIRE_FFMPEG=1 target/pyenv/bin/python -m pytest -q python/tests
  # The CLI's --video-out through imageio-ffmpeg's static ffmpeg (the tests step skipped it: no
  # ffmpeg there).
  WGVAE_REQUIRE_FFMPEG=1 \
    WGVAE_FFMPEG="$(target/pyenv/bin/python -c 'import imageio_ffmpeg; print(imageio_ffmpeg.get_ffmpeg_exe())')" \
    cargo test --workspace --test video_out
}
step_package() {
  tools
  # The crate's file list and .crate archive (no verify build: the tests step built it); --allow-dirty
  # so that the line also runs in a working tree with uncommitted edits.
  cargo package --list --allow-dirty -p wgvae > target/package-files.txt
  echo "crate: $(wc -l < target/package-files.txt) files"
  cargo package --no-verify --allow-dirty -p wgvae
  rm -rf target/ci-sdist
  target/pytools/bin/maturin sdist -m python/Cargo.toml --out target/ci-sdist
  set -- target/ci-sdist/wgvae-*.tar.gz target/ci-wheel/wgvae-*.whl
  [ -e "$2" ] || { echo "no wheel in target/ci-wheel: run the python step first" >&2; return 1; }
  target/pytools/bin/twine check --strict "$@"
}
step_coopmat() { ci/coopmat.sh; }
step_gpu-kit() {
  bench/gpu/run.sh --quick --cargo-profile dev --skip tests \
    --skip-reason "cargo test --workspace ran them" --out target/gpu-quick
  # The GPU session's tuning run, every stage at 64² on lavapipe (docs/gpu.md), with the
  # wgvae run.sh just built (cargo's own build here rebuilt it for 135 s).
  rm -rf target/gpu-tune
  bench/gpu/tune.sh --dry --bin target/debug --out target/gpu-tune
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
