#!/usr/bin/env bash
# The GPU KV cache's precision at long context, in one run on the GPU machine: decode after an
# empty context and after a long prompt, the default cache (f16 at native/f16, int8 at
# w8a8/w4a8) beside `--ablate f32-kv` in each bench (the same binary; every configuration
# checked against the CPU backend before it is timed), each depth timed twice (depths in
# order, then again) so that a drift of the machine shows; then the latency per token from
# position 0 to HIL_LONG per 512-token window (p99/median), default and f32.
#   HIL_SHAPES (qwen2.5-1.5b), HIL_TYPES (q4_0): the same-shape models written here;
#   HIL_DEPTHS ("1 4096"): the prompt lengths; HIL_LONG (4096; 0: none): the window run;
#   HIL_BINS ("leanstream"): the staged builds to time (others as $h/NAME.xz, e.g. an earlier
#   commit's), each beside the others at each depth, in reverse order in the second round;
#   HIL_ROUNDS (2): 1 leaves the second round out.
# Run in one device call carrying hil-out/: `HIL_DIR=hil-out bash scripts/hil-kv-cache.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
h=${HIL_DIR:-hil-out}
res=${OUT:-$h/results}; mkdir -p "$res"
. "$(dirname "$0")/hil-setup.sh"
bins=${HIL_BINS:-leanstream}
for b in $bins; do
  [ -x "$h/$b" ] || { [ -f "$h/$b.xz" ] && xz -dc "$h/$b.xz" > "$h/$b" && chmod +x "$h/$b"; }
  [ -x "$h/$b" ] || { echo "missing $h/$b"; exit 2; }
done
gguf_py
syn=/tmp/synth; mkdir -p $syn
for shape in ${HIL_SHAPES:-qwen2.5-1.5b}; do
  python3 scripts/synth-gguf.py bench-shapes/$shape.toml $syn --types ${HIL_TYPES:-q4_0} || exit 1
done
models=$(ls $syn/*.gguf | tr '\n' ',' | sed 's/,$//')
rc=0
for round in $(seq 1 ${HIL_ROUNDS:-2}); do
  order=$bins; [ $round = 2 ] && order=$(echo $bins | tr ' ' '\n' | tac | tr '\n' ' ')
  for depth in ${HIL_DEPTHS:-1 4096}; do
    for b in $order; do
      echo "== round $round, $b, prompt $depth"
      timeout ${HIL_BENCH_TIMEOUT:-300} $h/$b bench --model "$models" --backend cuda --memory discrete \
        --prompt-tokens $depth --gen-tokens 128 --reps 3 --threads 16 --ablate f32-kv \
        --markdown "$res/r$round-$b-d$depth.md" 2>&1 | tee "$res/r$round-$b-d$depth.txt"
      rc=$(( rc | ${PIPESTATUS[0]} ))
    done
  done
done
if [ "${HIL_LONG:-4096}" != 0 ]; then
  for f in $syn/*.gguf; do
    n=$(basename "$f" .gguf)
    echo "== long context $n"
    timeout ${HIL_BENCH_TIMEOUT:-300} $h/leanstream bench --model "$f" --backend cuda --memory discrete \
      --long-context ${HIL_LONG:-4096} --ablate f32-kv --markdown "$res/long-$n.md" 2>&1 | tee "$res/long-$n.txt"
    rc=$(( rc | ${PIPESTATUS[0]} ))
  done
fi
echo "== summary"
for f in "$res"/r*-d*.md "$res"/long-*.md; do [ -f "$f" ] && { echo "-- $(basename "$f")"; cat "$f"; }; done
exit $rc
