#!/usr/bin/env bash
# Hardware-in-the-loop profile (GPU machine, over what scripts/hil.sh staged): where one decode
# step's time goes, per kernel. Writes same-shape random-weight models of PROFILE_SHAPE
# (bench-shapes/, default qwen2.5-1.5b) in PROFILE_TYPES (default f16,q8_0,q4_0), then for each
# runs Nsight Compute over the third decoded token's kernels (`generate --ablate no-graph`: the graph
# hides kernel boundaries from the profiler) and prints, per kernel of layer 1 and the logits:
# time, DRAM bytes, the stream rate, registers, grid and achieved occupancy; then the step's
# sum over every kernel. Results land in $OUT (else $HIL_DIR/results): profile-*.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
h=${HIL_DIR:-hil-out}
res=${OUT:-$h/results}; mkdir -p "$res"
[ -f "$h/leanstream.xz" ] && [ ! -x "$h/leanstream" ] && { xz -dc "$h/leanstream.xz" > "$h/leanstream" && chmod +x "$h/leanstream"; }
[ -f "$h/leanstream.gz" ] && [ ! -x "$h/leanstream" ] && { gunzip -c "$h/leanstream.gz" > "$h/leanstream" && chmod +x "$h/leanstream"; }
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
python3 -c 'import gguf' 2>/dev/null || {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/gguf-*.whl && export PYTHONPATH=/tmp/site; }
shape=${PROFILE_SHAPE:-qwen2.5-1.5b}
syn=/tmp/synth; mkdir -p $syn
[ -f $syn/.$shape ] || { python3 scripts/synth-gguf.py bench-shapes/$shape.toml $syn --types ${PROFILE_TYPES:-f16,q8_0,q4_0} && touch $syn/.$shape; }
layers=$(sed -n 's/^layers *= *//p' bench-shapes/$shape.toml)
per_step=$(( 5 * layers + 2 ))  # embed, 5 per layer (q/k/v, attention, wo, gate/up, down), logits
metrics=gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active
for f in $syn/$shape*.gguf; do
  name=$(basename "$f" .gguf)
  echo "== $name ${PROFILE_PRECISION:-native}"
  "$ncu" --log-file "$res/profile-$name.csv" --kernel-name regex:'embed|matvec|attention' --launch-skip $(( 2 * per_step )) --launch-count $per_step \
    --metrics $metrics --csv --page raw --print-units base \
    $h/leanstream generate --model "$f" --backend cuda --memory discrete --ablate no-graph \
    --precision ${PROFILE_PRECISION:-native} --prompt "" --max-tokens 4 > /dev/null 2> "$res/profile-$name.err"
  python3 - "$res/profile-$name.csv" $layers <<'EOF'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1], errors='replace') if l.startswith('"'))]
rows = [r for r in rows if r.get("Kernel Name") and r["gpu__time_duration.sum"][0].isdigit()]
def num(r, k):
    return float(r[k].replace(",", ""))
total_t = sum(num(r, "gpu__time_duration.sum") for r in rows)  # ns
total_b = sum(num(r, "dram__bytes_read.sum") for r in rows)
print(f"{len(rows)} kernels, step sum {total_t / 1e3:.1f} us, {total_b / 1e6:.1f} MB read, {total_b / total_t:.0f} GB/s")
pick = rows[6:11] + rows[-1:]  # layer 1's five kernels, then the logits
print(f"{'kernel':28} {'us':>7} {'MB':>7} {'GB/s':>6} {'regs':>4} {'grid':>5} {'occ%':>5}")
for r in pick:
    t, b = num(r, "gpu__time_duration.sum"), num(r, "dram__bytes_read.sum")
    print(f"{r['Kernel Name'][:28]:28} {t / 1e3:7.1f} {b / 1e6:7.2f} {b / t:6.0f} {r['launch__registers_per_thread']:>4} "
          f"{r['launch__grid_size']:>5} {num(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f}")
EOF
done
# PROFILE_DETAIL=1: Nsight Compute's full sections (throughput, memory, warp stalls, occupancy)
# for layer 1's five kernels of each model, for why a kernel takes what it takes.
if [ "${PROFILE_DETAIL:-0}" = 1 ]; then
  for f in $syn/$shape*.gguf; do
    name=$(basename "$f" .gguf)
    "$ncu" --kernel-name regex:'embed|matvec|attention' --launch-skip $(( 2 * per_step + 6 )) --launch-count 5 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section LaunchStats --section SchedulerStats \
      $h/leanstream generate --model "$f" --backend cuda --memory discrete --ablate no-graph \
      --precision ${PROFILE_PRECISION:-native} --prompt "" --max-tokens 4 > "$res/detail-$name.txt" 2>&1
  done
fi
# PROFILE_DEPTH=N: decode's attention kernel alone at position N (a prompt of N tokens through
# `bench`, then the third decoded token's first three layers) with Nsight Compute's full
# sections, on the PROFILE_DEPTH_TYPE (q4_0) file: why long-context attention takes what it takes.
if [ -n "${PROFILE_DEPTH:-}" ]; then
  f=$syn/$shape-${PROFILE_DEPTH_TYPE:-q4_0}.gguf
  "$ncu" --kernel-name regex:'^attention(_i8)?$' --launch-skip $(( 2 * layers )) --launch-count 3 --set full \
    $h/leanstream bench --model "$f" --backend cuda --memory discrete --precision ${PROFILE_PRECISION:-native} \
    --prompt-tokens $PROFILE_DEPTH --gen-tokens 4 --reps 1 --json /tmp/p.json --markdown /tmp/p.md \
    > "$res/attention-depth$PROFILE_DEPTH-$(basename "$f" .gguf).txt" 2>&1
fi
if [ "${PROFILE_BENCH:-1}" = 1 ]; then
  echo "== the same models timed with the graph (bench)"
  $h/leanstream bench --model "$(ls $syn/$shape*.gguf | tr '\n' ',' | sed 's/,$//')" --backend cuda --memory discrete \
    --precision ${PROFILE_PRECISION:-native} --prompt-tokens 16 --gen-tokens 128 --reps 3 --threads 16 2>&1 | tail -8
fi
