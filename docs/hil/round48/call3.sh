#!/bin/bash
# Round 48 call 3: gate/up's SwiGLU tiles made in a cluster of the tile's blocks (--ablate swiglu-cluster), q4_0 and q8_0, after one token and at 4,096.
h=hil-out; res=$OUT; . $h/scripts/hil-setup.sh >/dev/null; gguf_py
cp $h/leanstream /tmp/new
python3 $h/scripts/synth-gguf.py $h/bench-shapes/qwen2.5-1.5b.toml /tmp/s --types q4_0,q8_0 > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
b(){ /tmp/new bench --model /tmp/s/qwen2.5-1.5b-$1.gguf --backend cuda --memory discrete --prompt-tokens $2 --gen-tokens 128 --reps 3 --threads 16 --ablate $3 --markdown $res/$4.md > /tmp/$4.log 2>&1 || tail -5 /tmp/$4.log; echo "-- $1 P=$2"; awk -F'|' '/^\| (qwen|smol|llama)/{print $2, $8, $11, $14}' $res/$4.md; }
b q4_0 1 default,default,swiglu-cluster,default,swiglu-cluster,default,swiglu-cluster q4-1
for a in default swiglu-cluster; do
  if [ $a = default ]; then ab=""; else ab="--ablate $a"; fi
  /tmp/new gpu-timeline --model /tmp/s/qwen2.5-1.5b-q4_0.gguf --memory discrete --prompt-tokens 1 --steps 5 $ab --markdown $res/tl-$a.md > /dev/null 2>&1 || echo "timeline $a failed"
  echo "== $a"; grep -A7 "^| kernel | share | ready" $res/tl-$a.md
done
b q4_0 4096 default,default,swiglu-cluster,default,swiglu-cluster q4-4k
b q8_0 1 default,default,swiglu-cluster,default,swiglu-cluster q8-1
