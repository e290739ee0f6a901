#!/usr/bin/env bash
# HIL: batched prefill on the GPU (engine/cuda_prefill.rs), on the GPU machine over what
# scripts/hil.sh staged (carry hil-out/leanstream.xz and .whl). Builds nothing of ours.
#   1. same-shape random-weight models written here (HIL_SHAPES, HIL_TYPES);
#   2. prompt processing of HIL_PROMPT (512) tokens, batched against token by token
#      (`--ablate token-prefill`, or HIL_PREFILL_ABLATE), every file in one bench run (each checked against the CPU
#      backend first, through the batched path);
#   3. time to first token at 128, 512, 1000 and 4000 prompt tokens (HIL_TTFT) on the
#      HIL_TTFT_SHAPE files (default the 1.5B shape), discrete and, with HIL_UNIFIED=1, unified.
# LLAMA_SRC (a tar.xz of the llama-cpp-python sdist's vendor/llama.cpp; never committed), when
# set: llama.cpp built here for this GPU (CUDA) and `llama-bench -p HIL_PROMPT -n 0` on the same
# files, in the same call (scripts/hil-llama.sh: a build longer than a call resumes).
# Results in $OUT (else hil-out/results/prefill).
set -uo pipefail
cd "$(dirname "$0")/.."
h=${HIL_DIR:-hil-out}
res=${OUT:-$h/results/prefill}; mkdir -p "$res"
. "$(dirname "$0")/hil-setup.sh"
gguf_py

. "$(dirname "$0")/hil-llama.sh"

syn=/tmp/synth; mkdir -p $syn
types=${HIL_TYPES:-f16,q8_0,q4_0}
for shape in ${HIL_SHAPES:-smollm2-135m qwen2.5-1.5b}; do
  [ -f $syn/.$shape ] || { python3 scripts/synth-gguf.py bench-shapes/$shape.toml $syn --types $types && touch $syn/.$shape; } || exit 1
done
files=$(ls $syn/*.gguf | tr '\n' ',' | sed 's/,$//')
rc=0
prompt=${HIL_PROMPT:-512}

echo "== prefill $prompt tokens: batched against token by token"
timeout ${HIL_BENCH_TIMEOUT:-400} $h/leanstream bench --model "$files" --backend cuda --memory discrete \
  --prompt-tokens $prompt --gen-tokens 16 --reps 3 ${HIL_PREFILL_ABLATE---ablate token-prefill} \
  --json "$res/prefill-$prompt.json" --markdown "$res/prefill-$prompt.md" --png "$res/prefill-$prompt.png" 2>&1 \
  | tee "$res/prefill-$prompt.txt"
rc=$(( rc | ${PIPESTATUS[0]} ))
if [ -n "$llama" ]; then
  echo "== llama.cpp pp$prompt"
  for f in ${files//,/ }; do
    timeout 120 $llama -m "$f" -p $prompt -n 0 -r 3 -o md 2>/dev/null | tee -a "$res/llama-pp$prompt.md"
  done
fi

ttft_files=$(ls $syn/${HIL_TTFT_SHAPE:-qwen2.5-1.5b}*.gguf | tr '\n' ',' | sed 's/,$//')
for memory in discrete ${HIL_UNIFIED:+unified}; do
  for n in ${HIL_TTFT:-128 512 1000 4000}; do
    echo "== time to first token, $n prompt tokens, $memory"
    timeout ${HIL_BENCH_TIMEOUT:-400} $h/leanstream bench --model "$ttft_files" --backend cuda --memory $memory \
      --prompt-tokens $n --gen-tokens 4 --reps 3 \
      --json "$res/ttft-$memory-$n.json" --markdown "$res/ttft-$memory-$n.md" --png "$res/ttft-$memory-$n.png" 2>&1 \
      | tee "$res/ttft-$memory-$n.txt"
    rc=$(( rc | ${PIPESTATUS[0]} ))
  done
done
echo "== summary"
for f in "$res"/prefill-*.md "$res"/llama-*.md "$res"/ttft-*.md; do [ -f "$f" ] && { echo "-- $(basename "$f")"; cat "$f"; }; done
exit $rc
