#!/usr/bin/env bash
# Everything CI checks, from a fresh clone: fetch the models the tests use, then formatting,
# lints and the whole test suite, then the CPU kernels built for aarch64 and tested under qemu,
# then the Jetson package built and checked (its aarch64 binaries run under qemu too).
# Tests whose data, GPU or tools are missing print `skipped: ...`; the end lists them all.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh >/dev/null
if [ -x ../shared/scripts/fetch-models.sh ]; then
  ../shared/scripts/fetch-models.sh qwen2.5-0.5b >/dev/null
else
  echo "skipped: ../shared not found: Qwen2.5-0.5B, stories260K, tokenizer vectors and WikiText-2 tests will skip"
fi
# zig and cargo-zigbuild link the aarch64 binaries for JetPack 5's glibc 2.31 (scripts/package.sh).
python3 -m pip install --quiet openai httpx "nvidia-cuda-nvrtc-cu12==12.6.*" "ziglang==0.17.*" "cargo-zigbuild==0.24.*"
# The committed PTX must be what its .cu sources compile to (NVRTC 12.6 from PyPI, no GPU).
python3 scripts/build-ptx.py --check
cargo fmt --check
cargo clippy --all-targets -- -D warnings
# A CPU-only build (no `cuda` feature, no cudarc) must build and lint too.
cargo clippy --all-targets --no-default-features -- -D warnings
# Everything is also kept in a log, so that the tests which skipped (they pass as "ok") are
# counted and listed at the end, each with its test's name.
log=$(mktemp); trap 'rm -f "$log"' EXIT
cargo test --no-fail-fast -- --show-output 2>&1 | tee "$log"
# The same kernels built for the Jetson's aarch64 CPU and run under qemu (NEON against scalar).
echo "     Running scripts/test-aarch64.sh" >> "$log"
scripts/test-aarch64.sh 2>&1 | tee -a "$log"
# The Jetson package: built for one board, lintian, systemd-analyze, its binaries under qemu
# against the x86 build, its maintainer scripts in a scratch root (tests/package.rs).
echo "     Running scripts/test-package.sh" >> "$log"
scripts/test-package.sh 2>&1 | tee -a "$log"
skips=$(awk '
  /^ *Running / { bin = ($2 == "unittests") ? $3 : $2; name = bin }
  /^---- .* stdout ----$/ { name = bin "::" $2 }
  /skipped: / { line = $0; sub(/.*skipped: /, "", line); print "  " name ": skipped: " line }
' "$log" | sort -u)
if [ -n "$skips" ]; then
  echo "== $(printf '%s\n' "$skips" | wc -l) skip(s): these checks did not run (the tests count as ok):"
  printf '%s\n' "$skips"
else
  echo "== no test skipped"
fi
