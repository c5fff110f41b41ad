#!/bin/bash
# One device call (~450 s; repository root with lookahead.patch applied, carrying .kc_la.tar.xz and
# .la.tar.xz from build.sh): the lookahead A/B (the tree against main, pass 1 alone once; tests,
# compare, memcheck/racecheck), then the planner sweeps of docs/studies/h200_sweeps/ on main's kernels.
set -o pipefail
export PYTHONUNBUFFERED=1
KC=.kc_la TREES=.la BASE=.la_base EXTRA=".la_p1" timeout 330 bash docs/studies/prepare_frags/ab_round.sh \
  > $OUT/ab_round.txt 2>&1
echo "ab_round at ${SECONDS}s"
cd .la_base
export PYKDA_CACHE_DIR=$PWD/../.kc_la PYTHONPATH=.
timeout 80 python -m pykda bench decode --stages 4,5,6 \
  --shapes 32/32:8192,16/16:8192,32/8:131072,128/8:65536,64/8:50000,8/1:1048576 > $OUT/decode_stages.txt 2>&1
timeout 60 python -m pykda bench kda --shapes 8:131072,1:1048576 --segment-chunks 256,512,1024 --warps 8 \
  > $OUT/kda_segments.txt 2>&1
cd ..
grep -v "%|" $OUT/decode_stages.txt | tail -20
grep -v "%|" $OUT/kda_segments.txt | tail -14
tail -16 $OUT/ab_round.txt
echo "done at ${SECONDS}s"
