#!/usr/bin/env bash
# Hardware-in-the-loop, part 2: runs on the GPU machine over what scripts/hil.sh staged in
# hil-out/. Builds nothing. GPU tests first (flags; CPU/CUDA parity in both memory models),
# then the benchmarks on same-shape random-weight models written here from bench-shapes/
# (every CUDA configuration is checked against the CPU backend before it is timed), then a
# short table last. Results land in $OUT (else hil-out/results): tests.txt, bench-*.md/json/png.
# HIL_DIR: where the staged binaries and models are (default hil-out; `.` when this script runs
# from the self-contained copy that scripts/hil.sh puts in hil-out/, see docs/HIL.md).
# Other knobs (a device call lasts at most 10 minutes, so a long run is split over calls):
#   HIL_TESTS=0 skips the GPU tests (HIL_TEST_FILTER: only those whose name holds it;
#   HIL_LONG_SHAPES: bench shapes whose q4_0 file the long-context attention test adds);
#   HIL_BENCH=0 the benchmarks (HIL_DISCRETE=0, HIL_UNIFIED=0,
#   HIL_W4A8=0 parts of them); HIL_SHAPES the bench-shapes
#   to write and time (HIL_TYPES: only these types); HIL_COMPARE the ablations beside each
#   discrete CUDA configuration (default --ablate no-graph,narrow,norm-tail); HIL_GEN (128) and HIL_UNIFIED_GEN the decoded
#   tokens; HIL_UNIFIED_MODELS picks the unified runs' models by name prefix, HIL_UNIFIED_COMPARE
#   the ablations beside them (default none);
#   HIL_BENCH_TIMEOUT (240 s) bounds each bench; HIL_KV=1 adds the int8 KV cache against the
#   f32 one (below).
set -uo pipefail
cd "$(dirname "$0")/.."
h=${HIL_DIR:-hil-out}
res=${OUT:-$h/results}; mkdir -p "$res"
. "$(dirname "$0")/hil-setup.sh"
m=$h/models

parity=$m/stories260K.bin
for f in $m/*.gguf; do [ -f "$f" ] && parity="$parity,$f"; done
# HIL_LONG_SHAPES: bench shapes whose q4_0 file the long-context attention test also runs.
long=""
for shape in ${HIL_LONG_SHAPES:-}; do
  gguf_py
  if python3 scripts/synth-gguf.py bench-shapes/$shape.toml /tmp/synth-long --types q4_0; then
    long="$long,/tmp/synth-long/$shape-q4_0.gguf"
  else
    echo "skipped: the long-context test on the $shape shape: synth-gguf.py failed (no gguf package, nor its wheel in .whl/ or $h/.whl/?)" | tee -a "$res/skipped.txt"
  fi
done
tests_rc=0
if [ "${HIL_TESTS:-1}" = 1 ]; then
  echo "== GPU tests (parity models: $parity; long-context models: ${long#,})"
  LEANSTREAM_HIL_MODELS=$parity LEANSTREAM_HIL_LONG_MODELS=${long#,} timeout ${HIL_TESTS_TIMEOUT:-300} $h/cuda-tests --test-threads=1 --nocapture ${HIL_TEST_FILTER:-} 2>&1 | tee "$res/tests.txt"
  tests_rc=${PIPESTATUS[0]}
  echo "== fixed memory on the GPU"
  LEANSTREAM_HIL_MODELS=$parity timeout 120 $h/cuda-no-alloc 2>&1 | tee "$res/no-alloc.txt"
  tests_rc=$(( tests_rc | ${PIPESTATUS[0]} ))
fi

bench_rc=0
if [ "${HIL_BENCH:-1}" = 1 ]; then
  echo "== same-shape random-weight models"
  gguf_py
  syn=/tmp/synth; mkdir -p $syn
  for shape in ${HIL_SHAPES:-smollm2-135m qwen2.5-0.5b qwen2.5-1.5b}; do
    [ -f $syn/.$shape ] || { python3 scripts/synth-gguf.py bench-shapes/$shape.toml $syn ${HIL_TYPES:+--types $HIL_TYPES} && touch $syn/.$shape; } || bench_rc=1
  done
  list() { ls $syn/$1*.gguf 2>/dev/null | tr '\n' ',' | sed 's/,$//'; }
  run_bench() {  # name, gen tokens, then bench arguments
    local name=$1 gen=$2; shift 2
    echo "== bench $name"
    timeout ${HIL_BENCH_TIMEOUT:-240} $h/leanstream bench "$@" --prompt-tokens 64 --gen-tokens $gen --reps 3 --threads 16 \
      --json "$res/bench-$name.json" --markdown "$res/bench-$name.md" --png "$res/bench-$name.png" 2>&1 \
      | tee "$res/bench-$name.txt"
    bench_rc=$(( bench_rc | ${PIPESTATUS[0]} ))
  }
  q4() { ls $syn/$1*-q4_0.gguf 2>/dev/null | tr '\n' ',' | sed 's/,$//'; }
  if [ "${HIL_DISCRETE:-1}" = 1 ]; then
    # HIL_COMPARE: the ablations timed beside each CUDA configuration (bench --help).
    run_bench gpu ${HIL_GEN:-128} --model "$(list '')" --backend cuda --memory discrete ${HIL_COMPARE---ablate no-graph,narrow,norm-tail}
    # w4a8 as LeanStream runs it: the q4_0 files with attention's q/k/v and the FFN's down
    # requantized to Q8_0 at load (quant::Role::Sensitive); the q4_0 rows above are all-4-bit.
    [ "${HIL_W4A8:-1}" = 1 ] && run_bench gpu-w4a8 ${HIL_GEN:-128} --model "$(q4 '')" --backend cuda --memory discrete --precision w4a8
  fi
  # Unified memory reads the weights over PCIe: a token of a large model takes tens of ms.
  um=${HIL_UNIFIED_MODELS:-smollm2}
  if [ "${HIL_UNIFIED:-1}" = 1 ]; then
    run_bench unified ${HIL_UNIFIED_GEN:-${HIL_GEN:-128}} --model "$(list $um)" --backend cuda,cpu --memory unified ${HIL_UNIFIED_COMPARE:-}
    [ "${HIL_W4A8:-1}" = 1 ] && run_bench unified-w4a8 ${HIL_UNIFIED_GEN:-${HIL_GEN:-128}} --model "$(q4 $um)" --backend cuda --memory unified --precision w4a8
  fi
  # HIL_KV=1: the int8 KV cache of w8a8/w4a8 against the f32 one (--ablate f32-kv), at
  # short context on every q8_0 (w8a8) and q4_0 (w4a8) file, and from position 0 to
  # HIL_KV_LONG (8192) on the HIL_KV_LONG_MODELS (default the 1.5B shape's q8_0 file) at w8a8;
  # HIL_KV_COMPARE adds ablations to the short-context runs.
  if [ "${HIL_KV:-0}" = 1 ]; then
    q8() { ls $syn/$1*-q8_0.gguf 2>/dev/null | tr '\n' ',' | sed 's/,$//'; }
    run_bench kv-w8a8 ${HIL_GEN:-128} --model "$(q8 '')" --backend cuda --memory discrete --precision w8a8 --ablate f32-kv ${HIL_KV_COMPARE:-}
    run_bench kv-w4a8 ${HIL_GEN:-128} --model "$(q4 '')" --backend cuda --memory discrete --precision w4a8 --ablate f32-kv ${HIL_KV_COMPARE:-}
    for f in ${HIL_KV_LONG_MODELS:-$syn/qwen2.5-1.5b-q8_0.gguf}; do
      n=$(basename "$f" .gguf)
      echo "== long context $n w8a8"
      timeout ${HIL_BENCH_TIMEOUT:-240} $h/leanstream bench --model "$f" --backend cuda --memory discrete --precision w8a8 \
        --long-context ${HIL_KV_LONG:-8192} --ablate f32-kv --json "$res/long-$n.json" --markdown "$res/long-$n.md" 2>&1 \
        | tee "$res/long-$n.txt"
      bench_rc=$(( bench_rc | ${PIPESTATUS[0]} ))
    done
  fi
fi

echo "== summary"
[ -f "$res/tests.txt" ] && grep -E "^test .*(ok|FAILED)$|^parity|^flags" "$res/tests.txt"
for f in "$res"/bench-*.md "$res"/long-*.md; do [ -f "$f" ] && { echo "-- $(basename "$f")"; cat "$f"; }; done
echo "tests rc=$tests_rc bench rc=$bench_rc"
exit $(( tests_rc | bench_rc ))
