#!/usr/bin/env bash
# The cooperative-matrix (tensor-core) path, verified on the CPU: Mesa 26's lavapipe implements
# VK_KHR_cooperative_matrix (8x8x8 f16 -> f16/f32), Debian bookworm's Mesa does not. Sid's Mesa
# needs sid's glibc, so this builds (or reuses) a Debian sid chroot from Debian's packages only,
# builds the tests and `wgvae` on the host, and runs them inside it with the cooperative path
# forced on (WGVAE_COOPERATIVE_MATRIX=on: a device without it fails the tests instead of
# skipping them):
#   1. `wgvae info --json` lists the 8x8x8 configurations and names the one used;
#   2. the cooperative-matrix probes (each load/store/accumulator pattern the kernels use,
#      exact), every conv2d and matmul kernel test and the attention's cooperative tests (against the
#      CPU reference on odd shapes: convs plain and with fused prologue/upsample/stride/
#      residual, frame offsets; GEMMs with transposes, batch strides, bias; flash attention
#      with odd token counts, d 64..512, key blocks split across dispatches);
#   3. tests/matrix_goldens.rs: AutoencoderKL, TAEF2, TAEHV and Wan goldens in f16 on the
#      matrices beside the scalar f16 path, within the scalar path's f16 bounds;
#   4. `wgvae decode --dtype f16 --cooperative-matrix on --json` names the configuration.
# Usage: ci/coopmat.sh [--keep-mounts]. Needs root (debootstrap, chroot, mounts) and the shared
# test data beside the project. WGVAE_COOPMAT_ROOT sets the chroot folder (default
# target/coopmat-sid: `cargo clean` removes it), DEBIAN_MIRROR the mirror.
set -euo pipefail
cd "$(dirname "$0")/.."
proj=$(pwd -P)
shared=$(cd "${WGVAE_SHARED_DIR:-../shared}" && pwd -P)
root=${WGVAE_COOPMAT_ROOT:-$proj/target/coopmat-sid}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
started=$(date +%s)
say() { echo "coopmat [$(($(date +%s) - started)) s]: $*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "ci/coopmat.sh needs root (debootstrap, chroot, bind mounts)" >&2
  exit 1
fi

# 1. The chroot: Debian sid with Mesa's Vulkan drivers (reused when its Mesa is 26 or later).
mesa_version() { chroot "$root" dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true; }
if [ ! -x "$root/usr/bin/apt-get" ] || ! mesa_version | grep -Eq '^(2[6-9]|[3-9][0-9])\.'; then
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  fi
  if [ ! -x "$root/usr/bin/apt-get" ]; then
    say "debootstrap sid into $root"
    mkdir -p "$root"
    debootstrap --variant=minbase sid "$root" "$mirror" >"$root.debootstrap.log" 2>&1 \
      || { tail -20 "$root.debootstrap.log" >&2; exit 1; }
  fi
  say "installing Mesa's Vulkan drivers in the chroot"
  # The mirror's sid Release file may be past its Valid-Until: accept it (the packages are
  # still checked against Debian's keys).
  chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update -qq
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false \
    install -y -qq --no-install-recommends mesa-vulkan-drivers libvulkan1 >/dev/null
fi
say "chroot Mesa $(mesa_version)"

# 2. Host builds: the test binaries and the CLI (the README test line built most of it).
say "building tests and wgvae on the host"
cargo build --workspace --bins 2>&1 | tail -1
exes=$(cargo test --workspace --no-run --lib --test matrix_goldens 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
lib_tests=$(echo "$exes" | grep '/wgvae-' | head -1)
goldens=$(echo "$exes" | grep '/matrix_goldens-' | head -1)
[ -n "$lib_tests" ] && [ -n "$goldens" ] || { echo "test executables not found: $exes" >&2; exit 1; }

# 3. Mounts: the project and the shared data at the same paths as on the host.
mounts=()
mnt() { # mnt SRC DEST [mount options...]
  local dest="$root$2"
  mkdir -p "$dest"
  if ! mountpoint -q "$dest"; then
    mount "${@:3}" "$1" "$dest"
    mounts=("$dest" "${mounts[@]}")
  fi
}
cleanup() { for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" || true; done; }
[ "${1:-}" = "--keep-mounts" ] || trap cleanup EXIT
mnt proc /proc -t proc
mnt /dev /dev --bind
mnt "$proj" "$proj" --bind
mnt "$shared" "$shared" --bind
in_chroot() {
  chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root WGPU_BACKEND=vulkan \
    WGVAE_SHARED_DIR="$shared" WGVAE_REQUIRE_SHARED=1 WGVAE_REQUIRE_COOP=1 \
    WGVAE_COOPERATIVE_MATRIX=on sh -c "cd '$proj' && $*"
}

# 4. The checks.
say "wgvae info --json"
info=$(in_chroot ./target/debug/wgvae --cooperative-matrix on info --json 2>/dev/null)
echo "$info" | python3 -c '
import json, sys
c = json.load(sys.stdin)["chosen"]
m = c["cooperative_matrix"]
names = [x["name"] for x in m["configurations"]]
print("  adapter:", c["name"], "| configurations:", ", ".join(names), "| used:", m["used"])
assert "8x8x8 f16->f32" in names, names
assert m["used"] == "8x8x8 f16->f32", m
'
say "conv2d, matmul and attention kernel tests (cooperative variants against the CPU reference)"
in_chroot "$lib_tests kernels::coop_probe kernels::conv2d kernels::matmul kernels::attention::matrix --test-threads=2 2>&1" | grep -E 'worst|probe|test result|FAILED|panicked'
say "golden decodes in f16 on the matrices, beside the scalar path"
in_chroot "$goldens --test-threads=1 --nocapture 2>&1" | grep -E 'error|PSNR|test result|FAILED|panicked'
say "wgvae decode --dtype f16 --cooperative-matrix on --json"
out=$(mktemp -d)
trap '[ "${1:-}" = "--keep-mounts" ] || { cleanup; rm -rf "$out" "${root:?}$out"; }' EXIT
mkdir -p "$root$out"
mnt "$out" "$out" --bind
in_chroot ./target/debug/wgvae --cooperative-matrix on decode "$shared/golden/aekl-tiny-sd/latents.npy" \
  --vae "$shared/golden/aekl-tiny-sd" --dtype f16 --json --save-raw "$out/raw.npy" -o "$out/sd.png" 2>/dev/null \
  | tee "$out/decode.json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("  aekl-tiny-sd:", d["dtype"], "cooperative_matrix:", d["cooperative_matrix"], "decode_ms: %.0f" % d["decode_ms"])
assert d["cooperative_matrix"] == "8x8x8 f16->f32", d["cooperative_matrix"]
'
say "all cooperative-matrix checks passed"
