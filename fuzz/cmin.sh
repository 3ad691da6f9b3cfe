#!/bin/sh
# Minimises fuzz/corpus/<target> to a set cover of libFuzzer's features
# (edges and hit counters), then writes the hand-made seeds back.
set -e
cd "$(dirname "$0")"
for t in "$@"; do
    tmp=$(mktemp -d)
    ./target/x86_64-unknown-linux-gnu/release/$t -merge=1 -set_cover_merge=1 "$tmp" corpus/$t 2>&1 | tail -n 1
    rm -rf corpus/$t && mv "$tmp" corpus/$t && chmod 755 corpus/$t
done
python3 seeds.py
