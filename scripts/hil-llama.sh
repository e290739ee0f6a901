# Sourced by the HIL scripts that compare with llama.cpp on the GPU machine (hil-prefill.sh,
# hil-decode.sh): with LLAMA_SRC (a tar.xz of the llama-cpp-python sdist's vendor/llama.cpp;
# never committed) set, llama.cpp is built here for this GPU (CUDA, sm_90) in LLAMA_BUILD_DIR
# (/tmp/llama-cuda), and `llama` names its llama-bench ("" without LLAMA_SRC or when the build
# has not finished). The build resumes where a call ended (LLAMA_BUILD_TIMEOUT bounds it): the
# machine keeps the folder while it stays warm. HIL_LLAMA_ONLY=1 stops the caller after it.
# Needs `res` (the results folder). Builds nothing of ours.
llama=""
if [ -n "${LLAMA_SRC:-}" ]; then
  b=${LLAMA_BUILD_DIR:-/tmp/llama-cuda}
  if [ ! -x $b/llama.cpp/build/bin/llama-bench ]; then
    [ -d $b/llama.cpp ] || { mkdir -p $b && tar xJf "$LLAMA_SRC" -C $b; } || exit 1
    export PATH=$PATH:/usr/local/cuda/bin
    t0=$(date +%s)
    (cd $b/llama.cpp && { [ -f build/CMakeCache.txt ] || cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF > $res/llama-cmake.log 2>&1; } \
      && timeout ${LLAMA_BUILD_TIMEOUT:-3000} cmake --build build --target llama-bench -j"$(nproc)" > $res/llama-build.log 2>&1) \
      || { echo "llama.cpp build failed or stopped (llama-*.log)"; tail -5 $res/llama-build.log; }
    echo "llama.cpp build: $(( $(date +%s) - t0 )) s this call" | tee -a $res/llama-build-time.txt
  fi
  [ -x $b/llama.cpp/build/bin/llama-bench ] && llama=$b/llama.cpp/build/bin/llama-bench
  [ "${HIL_LLAMA_ONLY:-0}" = 1 ] && exit 0
fi
