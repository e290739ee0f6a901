#!/usr/bin/env bash
# The low-bit CPU kernels on the GPU machine's processor (an Intel Xeon with AVX-VNNI, which the
# developer VM lacks): the kernel tests that need VNNI (each VNNI form equals the scalar kernel
# bit for bit), then `leanstream bench` over f16, w8a8 and w4a8 with and without VNNI on
# same-shape random-weight models (speed does not depend on the values), at 2 and 8 threads.
# Builds nothing: LS is a leanstream binary and TESTS the library's test binary, both built on
# the developer machine (`cargo test --release --lib --no-run` prints its path).
#   device: LS=out/leanstream TESTS=out/lib-tests bash scripts/lowbit-cpu-run.sh   (results in $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
ls_bin=${LS:-out/leanstream}
tests_bin=${TESTS:-out/lib-tests}
res=${OUT:-target/lowbit-cpu}; mkdir -p "$res"
if ! python3 -c 'import gguf' 2>/dev/null; then
  wheel=$(ls .whl/gguf-*.whl hil-out/.whl/gguf-*.whl 2>/dev/null | head -1)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$wheel" && export PYTHONPATH=/tmp/site
fi
{ lscpu | grep -E "^Model name|^CPU\(s\)"; echo "VNNI flags: $(grep -o -w -E 'avx_vnni|avx512_vnni|avx512vl' /proc/cpuinfo | sort -u | tr '\n' ' ')"; } | tee "$res/cpu.txt"
rc=0
echo "== kernel tests"
$tests_bin quant:: --nocapture 2>&1 | tee "$res/tests.txt" | grep -E "^test |skipped|checked|test result"
rc=$(( rc | ${PIPESTATUS[0]} ))
syn=/tmp/synth; mkdir -p $syn
for shape in ${LOWBIT_SHAPES:-smollm2-135m qwen2.5-0.5b}; do
  model=$syn/$shape-q8_0.gguf
  [ -f "$model" ] || python3 scripts/synth-gguf.py bench-shapes/$shape.toml $syn --types q8_0 >/dev/null || exit 1
  for t in ${LOWBIT_THREADS:-2 8}; do
    echo "== $shape, $t threads"
    $ls_bin bench --model "$model" --configs f16,w8a8,w4a8 --ablate no-vnni \
      --threads "$t" --prompt-tokens 16 --gen-tokens ${LOWBIT_GEN:-64} --reps ${LOWBIT_REPS:-5} \
      --json "$res/lowbit-$shape-$t.json" --markdown "$res/lowbit-$shape-$t.md" > "$res/lowbit-$shape-$t.txt" 2>&1
    rc=$(( rc | $? ))
  done
done
echo "== summary"
cat "$res/cpu.txt"
grep -E "^test result|checked|skipped" "$res/tests.txt"
for f in "$res"/lowbit-*.md; do echo "-- $(basename "$f" .md)"; cat "$f"; done
exit $rc
