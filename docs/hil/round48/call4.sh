#!/bin/bash
# Round 48 call 4: the GPU tests with swiglu-cluster on by default (67d1066).
h=hil-out; res=$OUT
HIL_TESTS_TIMEOUT=230 HIL_BENCH=0 bash $h/scripts/hil-run.sh > /tmp/tests.log 2>&1; echo "tests rc $?"
grep -E "^test |test result|allocation|skipped" $res/*.txt | tail -40
