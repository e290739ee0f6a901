#!/usr/bin/env bash
# HIL: dense decode on the GPU against llama.cpp in the same call (issue 29), on the GPU machine
# over what scripts/hil.sh staged (carry hil-out/leanstream.xz and .whl; with LLAMA_SRC, the
# llama.cpp source tar.xz too). Builds nothing of ours.
#   1. same-shape random-weight models written here (HIL_SHAPES, HIL_TYPES);
#   2. decode of 128 tokens after a prompt of each of HIL_DEPTHS tokens (unset: 1 and 4096):
#      `leanstream bench` (every file in one run, each checked against the CPU backend first;
#      HIL_DECODE_ABLATE adds ablations beside each), and with LLAMA_SRC `llama-bench -p 0 -n
#      128 -d <depth>` on the same files (scripts/hil-llama.sh builds it here, resuming across
#      calls);
#   3. with HIL_LONG (positions, e.g. 4608): latency per token from position 0 to HIL_LONG per
#      512-token window on the HIL_LONG_MODELS (default the 1.5B shape's q4_0 file), at
#      HIL_LONG_PRECISIONS (native), with HIL_LONG_ABLATE (per-head-attention) beside it.
# Results in $OUT (else hil-out/results/decode).
set -uo pipefail
cd "$(dirname "$0")/.."
h=${HIL_DIR:-hil-out}
res=${OUT:-$h/results/decode}; mkdir -p "$res"
. "$(dirname "$0")/hil-setup.sh"
gguf_py

. "$(dirname "$0")/hil-llama.sh"

syn=/tmp/synth; mkdir -p $syn
types=${HIL_TYPES:-f16,q8_0,q4_0,q4_k_m}
shapes=${HIL_SHAPES:-qwen2.5-1.5b smollm2-135m}
for shape in $shapes; do
  [ -f $syn/.$shape-$types ] || { python3 scripts/synth-gguf.py bench-shapes/$shape.toml $syn --types $types && touch $syn/.$shape-$types; } || exit 1
done
files=""
for shape in $shapes; do for t in ${types//,/ }; do
  f=$syn/$shape-$t.gguf; [ -f $f ] && files="$files,$f"
done; done
files=${files#,}
rc=0

for depth in ${HIL_DEPTHS-1 4096}; do
  echo "== decode after $depth prompt tokens"
  timeout ${HIL_BENCH_TIMEOUT:-400} $h/leanstream bench --model "$files" --backend cuda --memory discrete \
    --prompt-tokens $depth --gen-tokens 128 --reps 3 ${HIL_DECODE_ABLATE:+--ablate $HIL_DECODE_ABLATE} \
    --json "$res/decode-$depth.json" --markdown "$res/decode-$depth.md" --png "$res/decode-$depth.png" 2>&1 \
    | tee "$res/decode-$depth.txt"
  rc=$(( rc | ${PIPESTATUS[0]} ))
  if [ -n "$llama" ]; then
    # llama-bench's depth counts the tokens before the decode: 0 for our one-token prompt.
    d=$depth; [ "$d" = 1 ] && d=0
    echo "== llama.cpp tg128 at depth $d"
    for f in ${files//,/ }; do
      timeout 180 $llama -m "$f" -p 0 -n 128 -d $d -r 3 -o md 2>/dev/null | tee -a "$res/llama-tg128-d$d.md"
    done
  fi
done

if [ -n "${HIL_LONG:-}" ]; then
  for f in ${HIL_LONG_MODELS:-$syn/qwen2.5-1.5b-q4_0.gguf}; do
    for p in ${HIL_LONG_PRECISIONS:-native}; do
      n=$(basename "$f" .gguf)-$p
      echo "== long context $n"
      timeout ${HIL_BENCH_TIMEOUT:-400} $h/leanstream bench --model "$f" --backend cuda --memory discrete --precision $p \
        --long-context $HIL_LONG --ablate ${HIL_LONG_ABLATE:-per-head-attention} \
        --json "$res/long-$n.json" --markdown "$res/long-$n.md" 2>&1 | tee "$res/long-$n.txt"
      rc=$(( rc | ${PIPESTATUS[0]} ))
    done
  done
fi
echo "== summary"
for f in "$res"/decode-*.md "$res"/llama-*.md "$res"/long-*.md; do [ -f "$f" ] && { echo "-- $(basename "$f")"; cat "$f"; }; done
exit $rc
