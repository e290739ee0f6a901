#!/usr/bin/env bash
# The main job on the default model: fetch SmolLM2-135M-Instruct (first run only), build the
# release binary, and ask it a question through its chat template on the CPU backend.
#   usage: scripts/demo.sh ["your question"]
set -euo pipefail
cd "$(dirname "$0")/.."
model=$(scripts/fetch-model.sh)
# The first build compiles everything (a few minutes): cargo shows its progress.
echo "building target/release/leanstream ..." >&2
cargo build --release --bin leanstream
question=${1:-What is the capital of France? Answer in one sentence.}
exec target/release/leanstream generate --model "$model" --chat --prompt "$question" --max-tokens 64
