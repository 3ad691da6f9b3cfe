#!/bin/sh
# The recorded runs: each target to RUNS executions (default 1 000 000) on its
# corpus, then the corpus minimised and the hand-made seeds written back.
# Logs land in fuzz/logs/<target>.log (ignored); the last lines hold
# libFuzzer's final stats (executions, exec/s, peak RSS). The allocation
# bound is wgvae::fuzzing::BoundedAlloc's (libFuzzer's -malloc_limit_mb
# needs a sanitizer's malloc hooks).
set -e
cd "$(dirname "$0")"
RUNS=${RUNS:-1000000}
FLAGS="-O -s none --debug-assertions"
mkdir -p logs
for t in ${TARGETS:-fuzz_npy fuzz_config fuzz_safetensors fuzz_layout fuzz_png fuzz_wan_config}; do
    start=$(date +%s)
    cargo +nightly fuzz run $t $FLAGS -- -runs=$RUNS -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 > logs/$t.log 2>&1
    echo "$t: $RUNS runs in $(( $(date +%s) - start )) s" | tee -a logs/$t.log
done
