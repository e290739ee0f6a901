# Sourced by the HIL scripts: cuBLAS for the batched prefill's products (backend/cuda/blas.rs).
# cudarc looks for libcublas.so, libcublas.so.12, ...; a CUDA 13 install has libcublas.so.13
# outside ldconfig, so it is linked here under the first name cudarc tries. When found,
# LEANSTREAM_EXPECT_CUBLAS=1 makes the GPU tests fail on a silent fall-back to the PTX products.
cublas_lib=$(ls /usr/local/cuda*/targets/*/lib/libcublas.so.[0-9]* /usr/local/cuda*/lib64/libcublas.so.[0-9]* \
  /usr/lib/*/libcublas.so.[0-9]* 2>/dev/null | sort -V | tail -1)
if [ -n "$cublas_lib" ]; then
  mkdir -p /tmp/cublas-link && ln -sf "$cublas_lib" /tmp/cublas-link/libcublas.so
  export LD_LIBRARY_PATH=/tmp/cublas-link:$(dirname "$cublas_lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LEANSTREAM_EXPECT_CUBLAS=1
  echo "cuBLAS: $cublas_lib"
else
  echo "cuBLAS: not found (the batched prefill's products run on PTX)"
fi
