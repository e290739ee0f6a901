#!/usr/bin/env bash
# CPU decode against llama.cpp built natively (GGML_NATIVE=ON) on the machine it runs on, same
# same-shape files, same threads, one run: for the GPU machine's Xeon, where the developer VM's
# 2 cores cannot say what 8 threads do. Builds llama.cpp's llama-bench from LLAMA_SRC (a tar.xz of
# the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp; never committed) and nothing of ours:
# LS is a leanstream binary built on the developer machine. Shapes and types: KQ_SHAPES
# (default the 1.5B shape: K-quants need rows of whole 256s, which the 0.5B and SmolLM2 shapes
# lack), KQ_TYPES (q4_k_m,q4_0), KQ_THREADS (2 8).
#   device: LS=out/kq/leanstream LLAMA_SRC=out/kq/llama-trim.tar.xz bash scripts/cpu-vs-llamacpp-run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ls_bin=${LS:-out/kq/leanstream}
res=${OUT:-target/cpu-vs-llamacpp}; mkdir -p "$res"
[ -f "$ls_bin.gz" ] && { gunzip -c "$ls_bin.gz" > "$ls_bin"; chmod +x "$ls_bin"; }
lscpu | grep -E "^Model name|^CPU\(s\)" | tee "$res/cpu.txt"
build=/tmp/llama-native
if [ ! -x $build/llama.cpp/build/bin/llama-bench ]; then
  mkdir -p $build && tar xJf "${LLAMA_SRC:-out/kq/llama-trim.tar.xz}" -C $build || exit 1
  (cd $build/llama.cpp && cmake -B build -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_OPENSSL=OFF > $res/cmake.log 2>&1 && cmake --build build --target llama-bench -j"$(nproc)" > $res/build.log 2>&1) \
    || { tail -20 $res/cmake.log $res/build.log; exit 1; }
fi
if ! python3 -c 'import gguf' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/gguf-*.whl && export PYTHONPATH=/tmp/site
fi
syn=/tmp/synth; mkdir -p $syn
rc=0
for shape in ${KQ_SHAPES:-qwen2.5-1.5b}; do
  for ty in $(echo ${KQ_TYPES:-q4_k_m,q4_0} | tr ',' ' '); do
    model=$syn/$shape-$ty.gguf
    [ -f "$model" ] || python3 scripts/synth-gguf.py bench-shapes/$shape.toml $syn --types $ty > /dev/null || { rc=1; continue; }
    for t in ${KQ_THREADS:-2 8}; do
      echo "== $shape $ty, $t threads"
      python3 scripts/bench-vs-llamacpp.py --model "$model" --threads $t --prompt-tokens 64 \
        --gen-tokens ${KQ_GEN:-64} --reps ${KQ_REPS:-3} --llama-bench $build/llama.cpp/build/bin/llama-bench \
        --leanstream "$ls_bin" 2>&1 | tee "$res/$shape-$ty-$t.md"
      rc=$(( rc | ${PIPESTATUS[0]} ))
    done
  done
done
exit $rc
