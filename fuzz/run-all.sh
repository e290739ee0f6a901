#!/usr/bin/env bash
# Runs fuzz targets for RUNS executions each (or until MAX_TIME seconds, if set, pass), split over JOBS libFuzzer processes (seeds 1..JOBS,
# one shared corpus per target), one target at a time, and prints per target the executions
# done, the wall time and the executions per second. Built targets are taken from BIN.
#
#   cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz build && python3 gen-seeds.py
#   RUNS=10000000 JOBS=2 ./run-all.sh [target ...]        # default: every target
#
# SEED_BASE offsets the processes' libFuzzer seeds (SEED_BASE+1..SEED_BASE+JOBS), so that runs split
# over several calls from the same corpus do not repeat one another.
# Crash inputs go to artifacts/<target>/ (or $ARTIFACTS/<target>/); logs to $LOGS (default logs/).
set -u
cd "$(dirname "$0")"
RUNS=${RUNS:-10000000}
JOBS=${JOBS:-1}
BIN=${BIN:-target/x86_64-unknown-linux-gnu/release}
ARTIFACTS=${ARTIFACTS:-artifacts}
LOGS=${LOGS:-logs}
MAX_TIME=${MAX_TIME:-0}
declare -A MAX_LEN=([gguf]=4096 [request]=8192 [tokenizer]=1024 [chat]=2048 [tokenizer_gguf]=16384
    [llama2c]=4096 [llama2c_tok]=8192 [tables]=4096)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(tables llama2c gguf llama2c_tok tokenizer_gguf chat request tokenizer)
mkdir -p "$LOGS"
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "$ARTIFACTS/$t"
    per=$(( (RUNS + JOBS - 1) / JOBS ))
    start=$(date +%s.%N)
    pids=()
    for j in $(seq 1 "$JOBS"); do
        "$BIN/$t" "corpus/$t" -runs="$per" -max_len="${MAX_LEN[$t]}" -seed="$(( ${SEED_BASE:-0} + j ))" \
            -max_total_time="$MAX_TIME" \
            -artifact_prefix="$ARTIFACTS/$t/" -print_final_stats=1 > "$LOGS/$t.$j.log" 2>&1 &
        pids+=($!)
    done
    failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    end=$(date +%s.%N)
    execs=$(cat "$LOGS/$t".*.log | awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}')
    awk -v t="$t" -v e="$execs" -v a="$start" -v b="$end" -v j="$JOBS" -v f="$failed" \
        -v n="$(ls "$ARTIFACTS/$t" | wc -l)" 'BEGIN { s = b - a; printf "%s: %d executions in %.0f s over %d processes: %.0f exec/s in all, %.0f per process; failed: %d (%d artifacts)\n", t, e, s, j, e / s, e / s / j, f, n }'
    [ "$failed" = 0 ] || status=1
done
exit $status
