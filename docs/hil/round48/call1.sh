#!/bin/bash
# Round 48 call 1: round 47's unrun call 3 (norm-kept-swiglu-in-block.patch applied to 35c20f7 as
# new, 35c20f7 as old), plus the new binary's timeline at 4,096. It ran as
# docs/hil/round47/call3-unrun.sh with each bench's log written to /tmp/$4.log instead of $res
# (a call returns at most 8 files), followed by the lines below.
sed 's#> $res/$4.log 2>&1#> /tmp/$4.log 2>\&1 || tail -5 /tmp/$4.log#' docs/hil/round47/call3-unrun.sh > /tmp/call3-unrun.sh
. /tmp/call3-unrun.sh
/tmp/new gpu-timeline --model $M --memory discrete --prompt-tokens 4096 --steps 5 --markdown $res/tl-4k.md > /dev/null 2>&1 || echo "timeline 4k failed"
echo "== 4k"; grep -A7 "^| kernel | share | ready" $res/tl-4k.md
