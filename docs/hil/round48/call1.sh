#!/bin/bash
# Round 48 call 1: round 47's unrun call 3 (norm-kept-swiglu-in-block.patch applied to 35c20f7 as new, 35c20f7 as old), plus the new binary's timeline at 4,096.
h=hil-out; res=$OUT; . $h/scripts/hil-setup.sh >/dev/null; gguf_py
cp $h/leanstream /tmp/new; xz -dc $h/old.xz > /tmp/old; chmod +x /tmp/old
python3 $h/scripts/synth-gguf.py $h/bench-shapes/qwen2.5-1.5b.toml /tmp/s --types q4_0 > /dev/null 2>&1
M=/tmp/s/qwen2.5-1.5b-q4_0.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
b(){ $1 bench --model $M --backend cuda --memory discrete --prompt-tokens $2 --gen-tokens 128 --reps 3 --threads 16 --ablate $3 --markdown $res/$4.md > /tmp/$4.log 2>&1 || tail -5 /tmp/$4.log; echo "-- $1 P=$2"; awk -F'|' '/^\| (qwen|smol|llama)/{print $2, $8, $11, $14}' $res/$4.md; }
b /tmp/old 1 default,default,product-tpr=gate-up:8 old1
b /tmp/new 1 default,default,product-tpr=gate-up:8,default,product-tpr=gate-up:8 new1
b /tmp/old 1 default,default,product-tpr=gate-up:8 old2
b /tmp/new 4096 default,default,product-tpr=gate-up:8 new4k
b /tmp/old 4096 default,default,product-tpr=gate-up:8 old4k
for a in default product-tpr=gate-up:8; do
  n=$(echo $a | tr '=:' '__')
  if [ $a = default ]; then ab=""; else ab="--ablate $a"; fi
  /tmp/new gpu-timeline --model $M --memory discrete --prompt-tokens 1 --steps 5 $ab --markdown $res/tl-$n.md > /dev/null 2>&1 || echo "timeline $a failed"
  echo "== $a"; grep -A7 "^| kernel | share | ready" $res/tl-$n.md
done
for P in 4096; do
  /tmp/new gpu-timeline --model $M --memory discrete --prompt-tokens $P --steps 5 --markdown $res/tl-4k.md > /dev/null 2>&1 || echo "timeline 4k failed"
  echo "== 4k"; grep -A7 "^| kernel | share | ready" $res/tl-4k.md
done
