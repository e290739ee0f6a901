#!/usr/bin/env bash
# The Jetson's CPU is aarch64: builds the library for aarch64-unknown-linux-gnu and runs the
# kernel tests (matrix-vector products, sparse down projection, low-bit formats, KV cache,
# bundles) under qemu-user, so the NEON kernels are compiled and checked against the scalar
# reference here, on x86. Needs rustup, and qemu-user + gcc-aarch64-linux-gnu (installed with
# apt when root and missing); without them it prints `skipped: ...` and succeeds.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
skip() { echo "skipped: aarch64 kernel tests: $1"; exit 0; }
command -v rustup >/dev/null || skip "no rustup to add the $target standard library"
rustup target list --installed | grep -qx "$target" || rustup target add "$target" >/dev/null 2>&1 \
  || skip "rustup could not add $target"
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get install -y -q qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
      || { apt-get update -q && apt-get install -y -q qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross; }; } >/dev/null 2>&1 \
      || skip "apt could not install qemu-user and gcc-aarch64-linux-gnu"
  else
    skip "qemu-aarch64 or aarch64-linux-gnu-gcc missing (not root to install them)"
  fi
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo clippy -p leanstream --lib --target "$target" -- -D warnings
# Linked as scripts/package.sh links the package's binaries (zig, for glibc 2.31) when
# cargo-zigbuild is there: cargo's fingerprint holds the linker, so the release dependencies
# built here are the package's too, not rebuilt there. (A linker set in the environment would
# take the place of zig's, so none is.)
if command -v cargo-zigbuild >/dev/null; then
  cargo-zigbuild test -p leanstream --release --lib --target "$target.2.31" -- backend::cpu quant sparsity kv
else
  echo "test-aarch64.sh: no cargo-zigbuild on PATH: linking with aarch64-linux-gnu-gcc (scripts/package.sh will rebuild the dependencies)"
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc cargo test -p leanstream --release --lib --target "$target" -- backend::cpu quant sparsity kv
fi
