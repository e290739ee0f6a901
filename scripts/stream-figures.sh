#!/usr/bin/env bash
# The streamed-FFN figures of docs/STREAMING.md ("The streamed FFN on this disk"), in one
# command: traces and flash images of SmolLM2-135M (identity and coact placement), Qwen2.5-0.5B
# and Qwen2.5-1.5B, then `leanstream stream-bench` on each at two sparsities (the one within +3%
# perplexity of dense, and 80%), five FFN budgets and three cache policies. Reads are O_DIRECT:
# the page cache never serves a block (stream-bench says "reads with O_DIRECT" when the
# filesystem took the flag, and the figures are only kept then).
#
#   scripts/stream-figures.sh [OUT_DIR]     (default docs/streaming; work files in $WORK or a
#                                            fresh temporary folder, about 4 GB)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/streaming}
work=${WORK:-$(mktemp -d)}
mkdir -p "$out" "$work"
cargo build --release --bin leanstream
L=${LEANSTREAM:-target/release/leanstream}
W=../shared/data/wikitext-2/wiki.test.raw
smol=$(scripts/fetch-model.sh)
qwen05=$(../shared/scripts/fetch-models.sh qwen2.5-0.5b)
qwen15=$(../shared/scripts/fetch-models.sh qwen2.5-1.5b)

# Profiling traces (WikiText-2 tokens 0-255; the measured tokens come from 8192 on): the hot
# policy's block frequencies and the co-activation placement learn from them.
trace() { # model, tokens, out
  [ -f "$3" ] || "$L" trace --model "$1" --file "$W" --tokens "$2" --ctx "$2" --sparsity 0 --stages 1 --out "$3" >/dev/null
}
trace "$smol" 256 "$work/smol.st"
trace "$qwen05" 256 "$work/qwen05.st"
trace "$qwen15" 32 "$work/qwen15.st"

flash() { # model, placement, trace, out, [thresholds]
  [ -f "$4" ] || "$L" flash "$1" --board host --placement "$2" --trace "$3" --active-sparsity 0.8 \
    ${5:+--thresholds "$5"} --out "$4" >/dev/null
}
flash "$smol" identity "$work/smol.st" "$work/smol-identity.flash" tables/SmolLM2-135M-Instruct.Q4_1.thresh
flash "$smol" coact "$work/smol.st" "$work/smol-coact.flash" tables/SmolLM2-135M-Instruct.Q4_1.thresh
# Qwen's bundles fill one 4 KiB read unit each (k = 1): one neuron per block, so placement
# cannot change what is read; identity only.
flash "$qwen05" identity "$work/qwen05.st" "$work/qwen05-identity.flash" tables/qwen2.5-coder-0.5b-instruct.thresh
# Qwen2.5-1.5B has no committed table (it would be 14 MB): calibrated here, on tokens the
# figures do not use (16384-17407), as docs/SPARSITY.md's tables were.
[ -f "$work/qwen15.thresh" ] || "$L" calibrate --model "$qwen15" --file "$W" --skip-tokens 16384 \
  --tokens 1024 --ctx 512 --sparsity 0.3,0.5,0.6,0.7,0.8 --out "$work/qwen15.thresh" >/dev/null
flash "$qwen15" identity "$work/qwen15.st" "$work/qwen15-identity.flash" "$work/qwen15.thresh"

bench() { # name, model, images, ffn, sparsities, warm, tokens
  "$L" stream-bench --model "$2" --image "$3" --file "$W" --skip-tokens 8192 --ffn "$4" \
    --sparsity "$5" --warm-tokens "$6" --tokens "$7" --budgets 10,20,25,50,100 \
    --cache lru,lfu,hot --out "$out/stream-$1" > /dev/null
}
# +3% of dense perplexity: SmolLM2 and Qwen2.5-0.5B at 0.5 (docs/SPARSITY.md), Qwen2.5-1.5B at
# 0.6 (docs/STREAMING.md).
bench smollm2-135m "$smol" "$work/smol-identity.flash,$work/smol-coact.flash" oracle 0.5,0.8 16 48
bench qwen2.5-0.5b "$qwen05" "$work/qwen05-identity.flash" oracle 0.5,0.8 6 12
bench qwen2.5-1.5b "$qwen15" "$work/qwen15-identity.flash" oracle 0.6,0.8 2 6
python3 scripts/stream-tables.py "$out"/stream-smollm2-135m.json "$out"/stream-qwen2.5-0.5b.json \
  "$out"/stream-qwen2.5-1.5b.json > "$out/summary.md"
echo "figures in $out (summary: $out/summary.md; work files in $work)"
