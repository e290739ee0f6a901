#!/bin/bash
# Round 48 call 2: the attention knobs at 4,096 on the committed kernels (old.xz = 35c20f7's leanstream).
h=hil-out; res=$OUT; . $h/scripts/hil-setup.sh >/dev/null; gguf_py
xz -dc $h/old.xz > /tmp/old; chmod +x /tmp/old
python3 $h/scripts/synth-gguf.py $h/bench-shapes/qwen2.5-1.5b.toml /tmp/s --types q4_0 > /dev/null 2>&1
M=/tmp/s/qwen2.5-1.5b-q4_0.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
b(){ $1 bench --model $M --backend cuda --memory discrete --prompt-tokens $2 --gen-tokens 128 --reps 3 --threads 16 --ablate $3 --markdown $res/$4.md > /tmp/$4.log 2>&1 || tail -5 /tmp/$4.log; echo "-- $1 P=$2"; awk -F'|' '/^\| (qwen|smol|llama)/{print $2, $8, $11, $14}' $res/$4.md; }
b /tmp/old 4096 default,default,attention-threads=1024,attention-slice=128,attention-slice=512,default,no-cluster-attention,grouped-attention,cluster-until=4608,attention-threads=256,default k4a
b /tmp/old 1 default,default k1
