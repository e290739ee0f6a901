#!/usr/bin/env bash
# A change's GPU figures against an earlier commit's, in one run on the GPU machine: the two
# `leanstream` builds (staged here as hil-out/leanstream.xz by scripts/hil.sh and
# hil-out/leanstream-before.gz or .xz by hand, both for the h200-hil board) time the same synthetic
# same-shape models in the order before, after, after, before, so that a drift of the machine
# touches both sides alike; then the CPU backend the same way on the q4_0 files. Each bench
# checks its CUDA configurations against the CPU backend before timing them, as always.
#   HIL_SHAPES (smollm2-135m qwen2.5-1.5b) and HIL_TYPES (f16,q8_0,q4_0): the models;
#   HIL_DEPTHS (64): the prompt lengths decode starts after, each timed in the same order
#   (e.g. "1 4096" for long-context attention); HIL_CPU=0 leaves the CPU part out.
# Run in one device call carrying hil-out/: `HIL_DIR=hil-out bash scripts/hil-before-after.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
h=${HIL_DIR:-hil-out}
res=${OUT:-$h/results}; mkdir -p "$res"
for b in leanstream leanstream-before; do
  [ -f "$h/$b.xz" ] && { xz -dc "$h/$b.xz" > "$h/$b" && chmod +x "$h/$b"; }
  [ -f "$h/$b.gz" ] && { gunzip -c "$h/$b.gz" > "$h/$b" && chmod +x "$h/$b"; }
  [ -x "$h/$b" ] || { echo "missing $h/$b"; exit 2; }
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$res/gpu.txt"
if ! python3 -c 'import gguf' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $(ls .whl/gguf-*.whl "$h"/.whl/gguf-*.whl 2>/dev/null | head -1) && export PYTHONPATH=/tmp/site
fi
syn=/tmp/synth; mkdir -p $syn
for shape in ${HIL_SHAPES:-smollm2-135m qwen2.5-1.5b}; do
  python3 scripts/synth-gguf.py bench-shapes/$shape.toml $syn --types ${HIL_TYPES:-f16,q8_0,q4_0} || exit 1
done
models=$(ls $syn/*.gguf | tr '\n' ',' | sed 's/,$//')
rc=0
for depth in ${HIL_DEPTHS:-64}; do
  for side in before after after before; do
    bin=$h/leanstream; [ $side = before ] && bin=$h/leanstream-before
    n=$((${n:-0} + 1))
    echo "== $n: $side, prompt $depth"
    timeout ${HIL_BENCH_TIMEOUT:-300} $bin bench --model "$models" --backend cuda --memory discrete \
      --prompt-tokens $depth --gen-tokens 128 --reps 3 --threads 16 \
      --json "$res/$n-$side.json" --markdown "$res/$n-$side.md" --png "$res/$n-$side.png" 2>&1 \
      | tee "$res/$n-$side.txt"
    rc=$(( rc | ${PIPESTATUS[0]} ))
  done
done
[ "${HIL_CPU:-1}" = 0 ] && exit $rc
# The CPU backend on the same machine's Xeon, q4_0 files (the kernels most users run), the
# same order.
cpu_models=$(ls $syn/*-q4_0.gguf | tr '\n' ',' | sed 's/,$//')
for side in before after after before; do
  bin=$h/leanstream; [ $side = before ] && bin=$h/leanstream-before
  n=$((n + 1))
  echo "== $n: cpu $side"
  timeout ${HIL_BENCH_TIMEOUT:-300} $bin bench --model "$cpu_models" --backend cpu \
    --prompt-tokens 64 --gen-tokens ${HIL_CPU_GEN:-64} --reps 3 --threads ${HIL_CPU_THREADS:-16} \
    --json "$res/$n-cpu-$side.json" --markdown "$res/$n-cpu-$side.md" --png "$res/$n-cpu-$side.png" 2>&1 \
    | tee "$res/$n-cpu-$side.txt"
  rc=$(( rc | ${PIPESTATUS[0]} ))
done
exit $rc
