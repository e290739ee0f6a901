#!/usr/bin/env bash
# Hardware-in-the-loop: the GPU's streamed FFN on the GPU machine's disk (docs/STREAMING.md,
# "GPU: the streamed FFN fed by the lanes"). Runs there over what scripts/hil.sh staged in
# hil-out/ (the h200-hil build of `leanstream`) and block-set files recorded here from the real
# model (`leanstream stream-bench --record-sets`): writes a same-shape random-weight model of
# SHAPE (bench-shapes/SHAPE.toml) at Q8_0, flashes it at w8a8 for the h200-hil board onto the
# machine's disk, and replays each set file through `leanstream gpu-stream-bench`. Builds
# nothing of ours.
#   usage: bash scripts/hil-gpu-stream.sh SHAPE SETS... [-- gpu-stream-bench args]
#   e.g.   bash scripts/hil-gpu-stream.sh qwen2.5-1.5b hil-out/sets/q15-s0.5.sets -- --budgets 10,20,50
# Results land in $OUT (else hil-out/results): gpu-stream-<sets>.md and .json.
# HIL_DECODE=1 runs whole decode steps instead (`leanstream gpu-decode-bench`: the streamed
# GPU decoder replaying every set file, beside the same GGUF with every weight in memory):
# gpu-decode-<SHAPE>.md and .json.
# HIL_CONTROLLER=1 runs the controller on the GPU over the first set file instead (paper 3.2.3,
# Table 5): `controller gpu-profile` over HIL_PLANS (HIL_PROFILE_REPEATS runs each), `controller
# solve` into a LUT of HIL_STATES states, `controller gpu-compare` (HIL_COMPARE_REPEATS runs of
# the fixed plan, the best static one and the LUT); the args after -- go to both runs:
# ctl-<sets>.json (profile), .lut, .md (Table 5), and each step's .txt.
set -euo pipefail
cd "$(dirname "$0")/.."
h=${HIL_DIR:-hil-out}
res=${OUT:-$h/results}; mkdir -p "$res"
[ -f "$h/leanstream.xz" ] && { xz -dc "$h/leanstream.xz" > "$h/leanstream" && chmod +x "$h/leanstream"; }
[ -f "$h/leanstream.gz" ] && { gunzip -c "$h/leanstream.gz" > "$h/leanstream" && chmod +x "$h/leanstream"; }
shape=$1; shift
sets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do sets+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
if ! python3 -c 'import gguf' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $(ls .whl/gguf-*.whl "$h"/.whl/gguf-*.whl 2>/dev/null | head -1) && export PYTHONPATH=/tmp/site
fi
syn=/tmp/synth; mkdir -p $syn
gguf=$syn/$shape-q8_0.gguf
[ -f "$gguf" ] || python3 scripts/synth-gguf.py "bench-shapes/$shape.toml" $syn --types q8_0
img=$syn/$shape.w8.flash
[ -f "$img" ] || "$h/leanstream" flash "$gguf" --board h200-hil --precision w8a8 --out "$img" 2>&1 | tail -3
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${HIL_CONTROLLER:-0}" = 1 ]; then
  s=${sets[0]}; n=ctl-$(basename "$s" .sets)
  plans=${HIL_PLANS:-8:64:100:1,8:64:50:1,8:64:25:1,8:64:10:1,4:64:100:1,2:64:100:1,8:16:100:1,4:16:100:1,2:16:50:1}
  echo "== controller gpu-profile $shape $(basename "$s")"
  "$h/leanstream" controller gpu-profile --image "$img" --sets "$s" --plans "$plans" \
    --repeats "${HIL_PROFILE_REPEATS:-1}" --out "$res/$n.json" "$@" 2>&1 | tee "$res/$n-profile.txt"
  echo "== controller solve"
  "$h/leanstream" controller solve --profile "$res/$n.json" --states "${HIL_STATES:-4}" \
    --out "$res/$n.lut" 2>&1 | tee "$res/$n-solve.txt"
  echo "== controller gpu-compare"
  "$h/leanstream" controller gpu-compare --image "$img" --sets "$s" --profile "$res/$n.json" \
    --lut "$res/$n.lut" --repeats "${HIL_COMPARE_REPEATS:-3}" --out "$res/$n.md" "$@" 2>&1 \
    | tee "$res/$n-compare.txt"
  exit 0
fi
if [ "${HIL_DECODE:-0}" = 1 ]; then
  echo "== gpu-decode-bench $shape"
  "$h/leanstream" gpu-decode-bench --image "$img" --model "$gguf" --sets "$(IFS=,; echo "${sets[*]}")" \
    --markdown "$res/gpu-decode-$shape.md" --json "$res/gpu-decode-$shape.json" "$@" 2>&1 | tee "$res/gpu-decode-$shape.txt"
  exit "${PIPESTATUS[0]}"
fi
for s in "${sets[@]}"; do
  n=$(basename "$s" .sets)
  echo "== gpu-stream-bench $n"
  "$h/leanstream" gpu-stream-bench --image "$img" --sets "$s" \
    --markdown "$res/gpu-stream-$n.md" --json "$res/gpu-stream-$n.json" "$@" 2>&1 | tee "$res/gpu-stream-$n.txt"
done
