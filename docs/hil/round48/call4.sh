#!/bin/bash
# Round 48 call 4 (never ran: six starts refused, then no device time left; owed next round).
# The GPU tests on 67d1066 (swiglu-cluster on by default), with the SmolLM2 cut carried so that
# clusters of 4 run (its gate/up: narrow, 32 threads a row; hil.sh writes the cut only once
# ../shared/scripts/fetch-models.sh smollm2-135m has run, which this session did after its builds);
# then q4_0 at the 1.5B shape against no-swiglu-cluster and gate/up at 32 threads a row (clusters of 4).
h=hil-out; res=$OUT
HIL_TESTS_TIMEOUT=240 HIL_BENCH=0 bash $h/scripts/hil-run.sh > /tmp/tests.log 2>&1; echo "tests rc $?"
grep -E "^test |test result|allocation|skipped" $res/*.txt | tail -40
. $h/scripts/hil-setup.sh >/dev/null; gguf_py
cp $h/leanstream /tmp/new
python3 $h/scripts/synth-gguf.py $h/bench-shapes/qwen2.5-1.5b.toml /tmp/s --types q4_0 > /dev/null 2>&1
b(){ /tmp/new bench --model /tmp/s/qwen2.5-1.5b-$1.gguf --backend cuda --memory discrete --prompt-tokens $2 --gen-tokens 128 --reps 3 --threads 16 --ablate $3 --markdown $res/$4.md > /tmp/$4.log 2>&1 || tail -5 /tmp/$4.log; echo "-- $1 P=$2"; awk -F'|' '/^\| (qwen|smol|llama)/{print $2, $8, $11, $14}' $res/$4.md; }
b q4_0 1 default,default,no-swiglu-cluster,product-tpr=gate-up:32,default,no-swiglu-cluster,product-tpr=gate-up:32 q4-1
