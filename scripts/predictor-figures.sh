#!/usr/bin/env bash
# The predictor figures of docs/PREDICTORS.md, from one command:
#   scripts/predictor-figures.sh
# Per model (SmolLM2-135M, Qwen2.5-0.5B, and Qwen2.5-1.5B where its thresholds table exists):
# a training trace of WikiText-2 test text from token TRAIN_SKIP (100,000: far from the scored
# windows, the text the thresholds were calibrated on), a held-out trace of its first tokens
# (the perplexity windows' text), the stacked learnable hashing predictor trained at each
# sparsity, and `leanstream predictor-report` on the held-out trace (hash and the stale
# baseline) into docs/predictors/<model>-s<sparsity>.json.
# Two shapes per sparsity: the issue's (4 output heads of 8 bits: reports <model>-s<S>.json)
# and a small one (4 output heads of 4 bits, 16x smaller output tables: <model>-s<S>-o4.json).
# Deterministic: fixed text slices, fixed seed. Environment: MODELS_DIR, TRACES (where the
# traces go, default target/traces: they are large), SPARSITIES (0.5), EPOCHS (3), BATCH (128),
# LS (a leanstream binary instead of building one), ONLY (one model's short name), SHAPES
# ("default o4": which of the two), EXTRA (1: also the layer-ahead table, the DejaVu/BNN
# baselines and the refinement report, see extra(); 0: not), BASELINE_EPOCHS (5).
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS_DIR="${MODELS_DIR:-${LEANSTREAM_MODELS:-$HOME/.cache/leanstream/models}}"
TEXT=../shared/data/wikitext-2/wiki.test.raw
OUT=docs/predictors
TRACES="${TRACES:-target/traces}"
SPARSITIES="${SPARSITIES:-0.5}"
EPOCHS="${EPOCHS:-3}"
BATCH="${BATCH:-128}"
mkdir -p "$OUT" "$TRACES"
if [ -z "${LS:-}" ]; then
  cargo build --release --quiet -p leanstream-tools --bin leanstream
  LS=target/release/leanstream
fi

# name file train_tokens heldout_tokens
run_model() {
  local name=$1 file=$2 train_tokens=$3 heldout_tokens=$4
  local model="$MODELS_DIR/$file" thresh="tables/${file%.gguf}.thresh"
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ]; then return; fi
  if [ ! -f "$model" ]; then echo "skipped: $model not found"; return; fi
  if [ ! -f "$thresh" ]; then echo "skipped: $thresh not found (leanstream calibrate makes it)"; return; fi
  local train="$TRACES/pred-$name-train.st" heldout="$TRACES/pred-$name-heldout.st"
  [ -f "$train" ] || $LS trace --model "$model" --file "$TEXT" --skip-tokens "${TRAIN_SKIP:-100000}" \
    --tokens "$train_tokens" --ctx 512 --stages 1 --sparsity 0 --out "$train"
  [ -f "$heldout" ] || $LS trace --model "$model" --file "$TEXT" --skip-tokens 0 \
    --tokens "$heldout_tokens" --ctx 512 --stages 1 --sparsity 0 --out "$heldout"
  for s in ${SPARSITIES//,/ }; do
    for shape in ${SHAPES:-default o4}; do
      local tag="s$s" out_tau=8
      if [ "$shape" = o4 ]; then tag="s$s-o4"; out_tau=4; fi
      local table="$TRACES/$name-$tag.hashpred"
      $LS train-predictor --model "$model" --trace "$train" --thresholds "$thresh" --sparsity "$s" \
        --out-tau "$out_tau" --epochs "$EPOCHS" --batch "$BATCH" --seed 0 --out "$table" 2>&1 \
        | tee "$OUT/train-$name-$tag.txt"
      $LS predictor-report --model "$model" --trace "$heldout" --predictor "$table" \
        --thresholds "$thresh" --out "$OUT/$name-$tag.json" | tee "$OUT/report-$name-$tag.txt"
    done
    if [ "${EXTRA:-1}" = 1 ]; then
      extra "$name" "$model" "$thresh" "$train" "$heldout" "$s" "$heldout_tokens"
    fi
  done
}

# The rest of the paper's Table 6 and its figure 12 at sparsity S: the table guessing a layer
# ahead (input prev-ffn-output, out 4x4), the baselines (DejaVu on the layer's and the previous
# layer's input, BNN; rank 128, BASELINE_EPOCHS), one report of them all on the held-out trace
# (<model>-s<S>-baselines.json), and the refinement report on a held-out trace with 8 stages.
extra() {
  local name=$1 model=$2 thresh=$3 train=$4 heldout=$5 s=$6 heldout_tokens=$7
  local prev="$TRACES/$name-s$s-prev.hashpred" staged="$TRACES/pred-$name-heldout-k8-s$s.st"
  $LS train-predictor --model "$model" --trace "$train" --thresholds "$thresh" --sparsity "$s" \
    --out-tau 4 --epochs "$EPOCHS" --batch "$BATCH" --seed 0 --input prev-ffn-output --out "$prev"
  local baselines=()
  for kind in dejavu dejavu-stale bnn; do
    $LS train-baseline --model "$model" --trace "$train" --kind "$kind" --rank 128 \
      --epochs "${BASELINE_EPOCHS:-5}" --sparsity "$s" --out "$TRACES/$name-s$s-$kind.mlppred"
    baselines+=("$TRACES/$name-s$s-$kind.mlppred")
  done
  $LS predictor-report --model "$model" --trace "$heldout" --thresholds "$thresh" --predictor "$prev" \
    --baseline "$(IFS=,; echo "${baselines[*]}")" --out "$OUT/$name-s$s-baselines.json"
  [ -f "$staged" ] || $LS trace --model "$model" --file "$TEXT" --skip-tokens 0 \
    --tokens "$heldout_tokens" --ctx 512 --stages 8 --sparsity "$s" --out "$staged"
  $LS predictor-report --model "$model" --trace "$staged" --thresholds "$thresh" --predictor "$prev" \
    --out "$TRACES/$name-s$s-prev-report.json" --refine "$OUT/refine-$name-s$s.json"
}

run_model smollm2-135m SmolLM2-135M-Instruct.Q4_1.gguf 2048 1024
run_model qwen2.5-0.5b qwen2.5-coder-0.5b-instruct.gguf 1024 512
run_model qwen2.5-1.5b qwen2.5-coder-1.5b-instruct-q4_k_m.gguf 512 512
# The table of docs/PREDICTORS.md and the refinement plots.
python3 scripts/predictor-table.py "$OUT" | tee "$OUT/table.md"
python3 scripts/refine-plot.py "$OUT"
