#!/bin/sh
# Minimises fuzz/corpus/<target>: a set cover of libFuzzer's features (edges
# and hit counters) among inputs up to 4 KiB, plus the larger inputs that
# reach edges none of those reach; then writes the hand-made seeds back.
set -e
cd "$(dirname "$0")"
for t in "$@"; do
    bin=./target/x86_64-unknown-linux-gnu/release/$t
    small=$(mktemp -d) big=$(mktemp -d) out=$(mktemp -d)
    find corpus/$t -type f -size -4097c -exec cp {} "$small" \;
    find corpus/$t -type f -size +4096c -exec cp {} "$big" \;
    $bin -merge=1 -set_cover_merge=1 "$out" "$small" 2>&1 | tail -n 1
    $bin -merge=1 -use_counters=0 "$out" "$big" 2>&1 | tail -n 1
    rm -rf corpus/$t "$small" "$big" && mv "$out" corpus/$t && chmod 755 corpus/$t
done
python3 seeds.py
