#!/usr/bin/env bash
# The activation-sparsity quality report, docs/SPARSITY.md, from one command:
#   scripts/sparsity-report.sh [steps]     steps: any of calibrate ppl trace report (default: all)
# For SmolLM2-135M and Qwen2.5-0.5B: thresholds calibrated on WikiText-2 test text far from the
# scored windows (tokens from CALIB_SKIP on), perplexity of the first WINDOWS windows of 512
# (dense, then oracle with both scores at each sparsity), a trace of TRACE_TOKENS tokens and its
# statistics, then plots and the Markdown (scripts/sparsity-report.py).
# Everything is deterministic (greedy, no sampling; fixed text slices): rerunning gives the
# same figures. Environment: SMOL_WINDOWS, QWEN_WINDOWS (8), CALIB_TOKENS (2048), CALIB_SKIP
# (100000), TRACE_TOKENS (512), QWEN_TRACE_TOKENS (256), THREADS (board default), MODELS_DIR,
# LS (a leanstream binary to use instead of building one), SPARSITIES (the list to run),
# ONLY (smollm2-135m or qwen2.5-0.5b: one model), PPL_SUFFIX (appended to the ppl JSON's name).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-calibrate ppl trace report}"
MODELS_DIR="${MODELS_DIR:-${LEANSTREAM_MODELS:-$HOME/.cache/leanstream/models}}"
TEXT=../shared/data/wikitext-2/wiki.test.raw
OUT=docs/sparsity
TRACES="${TRACES:-target/traces}"
SPARSITIES="${SPARSITIES:-0.5,0.8,0,0.3,0.7,0.9}"
mkdir -p "$OUT" "$TRACES" tables
if [ -z "${LS:-}" ]; then
  cargo build --release --quiet
  LS=target/release/leanstream
fi
thr=()
[ -n "${THREADS:-}" ] && thr=(--threads "$THREADS")

run_model() {
  local name=$1 file=$2 windows=$3 trace_tokens=$4
  local model="$MODELS_DIR/$file" table="tables/${file%.gguf}.thresh"
  if [ ! -f "$model" ]; then echo "skipped: $model not found"; return; fi
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ]; then return; fi
  if [[ " $STEPS " == *" calibrate "* ]]; then
    $LS calibrate --model "$model" "${thr[@]}" --file "$TEXT" --skip-tokens "${CALIB_SKIP:-100000}" \
      --tokens "${CALIB_TOKENS:-2048}" --sparsity "$SPARSITIES" --out "$table" | tee "$OUT/calibrate-$name.txt"
  fi
  if [[ " $STEPS " == *" ppl "* ]]; then
    $LS perplexity --model "$model" "${thr[@]}" --file "$TEXT" --ctx 512 --chunks "$windows" \
      --ffn dense,oracle --score glu,gate --sparsity "$SPARSITIES" --thresholds "$table" \
      --json "$OUT/ppl-$name${PPL_SUFFIX:-}.json"
  fi
  if [[ " $STEPS " == *" trace "* ]]; then
    $LS trace --model "$model" "${thr[@]}" --file "$TEXT" --tokens "$trace_tokens" --stages 8 \
      --sparsity 0.8 --thresholds "$table" --out "$TRACES/$name.safetensors"
    $LS trace-stats --model "$model" "${thr[@]}" --trace "$TRACES/$name.safetensors" \
      --sparsity 0.5,0.8 --thresholds "$table" --json "$OUT/stats-$name.json"
  fi
}

run_model smollm2-135m SmolLM2-135M-Instruct.Q4_1.gguf "${SMOL_WINDOWS:-8}" "${TRACE_TOKENS:-512}"
run_model qwen2.5-0.5b qwen2.5-coder-0.5b-instruct.gguf "${QWEN_WINDOWS:-8}" "${QWEN_TRACE_TOKENS:-256}"
if [[ " $STEPS " == *" report "* ]]; then
  python3 scripts/sparsity-report.py "$OUT" docs/SPARSITY.md
fi
