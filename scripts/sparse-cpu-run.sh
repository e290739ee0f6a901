#!/usr/bin/env bash
# The sparse FFN's decode speed against dense on the GPU machine's processor (16 cores, no
# other tenant), as a second CPU beside the 2-core developer VM: a SmolLM2-135M-shaped Q4_1
# model with random weights (speed does not depend on the values), thresholds calibrated on
# it over README.md (any text: they only need to drop the asked fraction), then
# `leanstream bench` over dense, oracle and topk at 50% and 80% with both scores, at 2 and 8
# threads. Builds nothing: LS is a leanstream binary built on the developer machine.
#   device: LS=hil-out/leanstream bash scripts/sparse-cpu-run.sh    (results in $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
ls_bin=${LS:-hil-out/leanstream}
res=${OUT:-target/sparse-cpu}; mkdir -p "$res"
if ! python3 -c 'import gguf' 2>/dev/null; then
  wheel=$(ls .whl/gguf-*.whl hil-out/.whl/gguf-*.whl 2>/dev/null | head -1)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$wheel" && export PYTHONPATH=/tmp/site
fi
syn=/tmp/synth; mkdir -p $syn
model=$syn/smollm2-135m-q4_1.gguf
[ -f "$model" ] || python3 scripts/synth-gguf.py bench-shapes/smollm2-135m.toml $syn --types q4_1 || exit 1
lscpu | grep -E "^Model name|^CPU\(s\)" | tee "$res/cpu.txt"
$ls_bin calibrate --model "$model" --file README.md --tokens ${SPARSE_CALIB_TOKENS:-1024} \
  --sparsity 0.5,0.8 --out $syn/smollm2-135m-q4_1.thresh || exit 1
rc=0
for t in ${SPARSE_THREADS:-2 8}; do
  echo "== sparse FFN, $t threads"
  $ls_bin bench --model "$model" --ffn dense,oracle,topk --score glu,gate --sparsity 0.5,0.8 \
    --thresholds $syn/smollm2-135m-q4_1.thresh --threads "$t" --prompt-tokens 16 \
    --gen-tokens ${SPARSE_GEN:-64} --reps ${SPARSE_REPS:-9} \
    --json "$res/sparse-cpu-$t.json" --markdown "$res/sparse-cpu-$t.md" 2>&1 | tee "$res/sparse-cpu-$t.txt"
  rc=$(( rc | ${PIPESTATUS[0]} ))
done
echo "== summary"
cat "$res/cpu.txt"
for t in ${SPARSE_THREADS:-2 8}; do cat "$res/sparse-cpu-$t.md"; done
exit $rc
