#!/usr/bin/env bash
# Builds what bench/gpu/run.sh --bin needs on a machine without Rust: the release
# `wgvae`, the test executables (`cargo test --no-run`) and the criterion bench
# executables (`cargo bench --no-run`), copied into OUT_DIR with a BUILD_INFO file.
#
#   bench/gpu/build_bins.sh [--link] [--no-tests] [--no-benches] [--profile P] [--strip] OUT_DIR
#
# --link symlinks instead of copying (run.sh uses it on the build machine itself);
# --no-tests skips the test executables; --no-benches builds only `wgvae` (cargo
# build); --profile builds with that cargo profile (default: release for `wgvae` and
# the benches, test for the tests; `dev` reuses what `cargo test` built); --strip strips the
# copies (with --profile release the test executables shrink from ~250 MB to ~10 MB each: what
# a size-limited transfer to a GPU machine needs). Layout of OUT_DIR:
#   wgvae                 the CLI (built by `cargo bench --no-run`, release profile)
#   tests/lib             the library's unit tests
#   tests/bin-wgvae       the CLI's unit tests
#   tests/<name>          each integration test (tests/<name>.rs)
#   benches/<name>        each criterion suite (benches/<name>.rs)
#   BUILD_INFO            commit, toolchain, date, target
set -euo pipefail
link=0
strip=0
tests=1
benches=1
profile=
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --link) link=1 ;;
    --no-tests) tests=0 ;;
    --no-benches) benches=0 ;;
    --profile) profile=${2:?--profile needs a cargo profile}; shift ;;
    --strip) strip=1 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "build_bins.sh: unknown option $1" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
[ -n "$out" ] || { echo "usage: build_bins.sh [--link] [--no-tests] [--no-benches] [--profile P] [--strip] OUT_DIR" >&2; exit 2; }
[ "$strip" = 1 ] && [ "$link" = 1 ] && { echo "build_bins.sh: --strip copies; it cannot be used with --link" >&2; exit 2; }
profile_args=()
[ -n "$profile" ] && profile_args=(--profile "$profile")
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
mkdir -p "$out/tests" "$out/benches"
out=$(cd "$out" && pwd)

# One compiler-artifact line per built target: "kind name test executable".
artifacts() {
  sed -n 's/.*"reason":"compiler-artifact".*"target":{"kind":\["\([a-z-]*\)"\][^}]*"name":"\([^"]*\)".*"profile":{[^}]*"test":\(true\|false\)}.*"executable":"\([^"]*\)".*/\1 \2 \3 \4/p'
}

place() { # SRC DEST
  rm -f "$2"
  if [ "$link" = 1 ]; then ln -s "$1" "$2"; else cp "$1" "$2"; fi
  if [ "$strip" = 1 ]; then strip "$2"; fi
}

# Benches (release profile) also build the `wgvae` binary (cargo builds binaries
# for benches and integration tests), so both come from one feature set.
json=$(mktemp)
trap 'rm -f "$json"' EXIT
if [ "$benches" = 1 ]; then
  cargo bench --no-run "${profile_args[@]}" --message-format=json >"$json"
else
  # Default: release, as `cargo bench` builds it.
  cargo build --bin wgvae --profile "${profile:-release}" --message-format=json >"$json"
fi
found_bin=0
while read -r kind name test exe; do
  case "$kind" in
    bench) place "$exe" "$out/benches/$name" ;;
    bin) if [ "$name" = wgvae ] && [ "$test" = false ]; then place "$exe" "$out/wgvae"; found_bin=1; fi ;;
  esac
done < <(artifacts <"$json")
[ "$found_bin" = 1 ] || { echo "build_bins.sh: cargo produced no wgvae binary" >&2; exit 1; }

if [ "$tests" = 1 ]; then
  cargo test --no-run "${profile_args[@]}" --message-format=json >"$json"
  while read -r kind name test exe; do
    [ "$test" = true ] || continue
    case "$kind" in
      lib) place "$exe" "$out/tests/lib" ;;
      bin) place "$exe" "$out/tests/bin-$name" ;;
      test) place "$exe" "$out/tests/$name" ;;
    esac
  done < <(artifacts <"$json")
fi

{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
  echo "rustc: $(rustc --version)"
  echo "cargo: $(cargo --version)"
  echo "target: $(rustc -vV | sed -n 's/^host: //p')"
  echo "built_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "built_on: $(uname -srm)"
} > "$out/BUILD_INFO"
echo "build_bins.sh: $(ls "$out/tests" | wc -l) test and $(ls "$out/benches" | wc -l) bench executables and wgvae in $out"
