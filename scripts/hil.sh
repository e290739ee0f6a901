#!/usr/bin/env bash
# Hardware-in-the-loop, part 1 (here, on the developer machine): builds the release binaries
# and the CUDA test binary for the h200-hil board and stages them with the parity models in
# hil-out/ (ignored by git, under the device call's 64 MiB). Part 2 runs on the GPU machine:
# the device call carries hil-out/ and runs `bash scripts/hil-run.sh` (docs/HIL.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export LEANSTREAM_BOARD=h200-hil
export CARGO_TARGET_DIR=target/hil
out=hil-out
rm -rf "$out"; mkdir -p "$out/models"

cargo build --release --bins
# A test binary's path: `cargo test --test NAME --no-run` builds it.
test_bin() {
  cargo test --release --test "$1" --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]==sys.argv[1] and m.get("executable"): print(m["executable"])' "$1" | tail -1
}
cp target/hil/release/leanstream target/hil/release/leanstreamd "$out/"
cp "$(test_bin cuda)" "$out/cuda-tests"
cp "$(test_bin cuda_no_alloc)" "$out/cuda-no-alloc"

# Parity models: stories260K whole, SmolLM2-135M and Qwen2.5-0.5B cut to a few layers (and
# Qwen's vocabulary cut) so that they travel (scripts/cut-gguf.py; same tensors, fewer of them).
shared=../shared/data/stories260K
models=~/.cache/leanstream/models
cp "$shared/stories260K.bin" "$shared/tok512.bin" "$out/models/"
if [ -f "$models/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  python3 scripts/cut-gguf.py "$models/SmolLM2-135M-Instruct.Q4_1.gguf" "$out/models/smollm2-135m-q4_1-cut4.gguf" --layers 4 --vocab 8192
fi
if [ -f "$models/qwen2.5-coder-0.5b-instruct.gguf" ]; then
  python3 scripts/cut-gguf.py "$models/qwen2.5-coder-0.5b-instruct.gguf" "$out/models/qwen2.5-0.5b-cut1.gguf" --layers 1 --vocab 4096
fi
strip "$out/leanstream" "$out/leanstreamd" "$out/cuda-tests" "$out/cuda-no-alloc" 2>/dev/null || true
# The binaries embed the PTX as text: compressed, they leave room under the call's 64 MiB
# (hil-setup.sh unpacks them). xz takes the four to about 7 MB against gzip's 16.5 MB.
for b in leanstream leanstreamd cuda-tests cuda-no-alloc; do
  rm -f "$out/$b.gz" "$out/$b.xz"; xz -9e -T2 "$out/$b"
done
# The synth script needs the gguf package on the GPU machine: carried as a wheel in .whl/.
mkdir -p .whl
[ -n "$(ls .whl/gguf-*.whl 2>/dev/null)" ] || python3 -m pip download -q --no-deps --only-binary=:all: -d .whl gguf==0.19.0
# A self-contained copy (scripts, shapes, wheel) so hil-out/ alone can travel, e.g. from a
# checkout that is not the one the device call sends: `HIL_DIR=. bash DIR/scripts/hil-run.sh`.
mkdir -p "$out/scripts" "$out/.whl"
cp scripts/hil-run.sh scripts/hil-setup.sh scripts/hil-cublas.sh scripts/hil-llama.sh scripts/hil-prefill.sh scripts/hil-decode.sh scripts/hil-profile.sh scripts/hil-before-after.sh scripts/hil-kv-cache.sh scripts/hil-gpu-stream.sh scripts/hil-daemon-stream.sh scripts/synth-gguf.py "$out/scripts/"
cp -r bench-shapes "$out/"
cp .whl/gguf-*.whl "$out/.whl/"
du -sh "$out"; ls -la "$out" "$out/models"
# A device call carries the tracked tree, shared/ and the carried paths, 64 MiB in all
# (docs/HIL.md round 26): say what that comes to, so a call is not refused at the door.
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
staged=$(du -sb "$out" | cut -f1)
echo "device call: tracked tree $((tree >> 20)) MiB + $out $((staged >> 20)) MiB = $(((tree + staged) >> 20)) MiB of 64"
# (The SmolLM2 cut is what the streamed-engine tests and cuda-no-alloc need; with the test
# binaries it fitted: docs/HIL.md round 29.)
[ $((tree + staged)) -lt $((64 << 20)) ] || echo "over 64 MiB: for the GPU tests remove $out/leanstream.xz, $out/leanstreamd.xz and $out/models/qwen2.5-0.5b-cut1.gguf; for benchmarks carry the binaries and stories260K only"
