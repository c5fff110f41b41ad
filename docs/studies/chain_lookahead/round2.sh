#!/bin/bash
# Session 66's second device call (~420 s; lookahead.patch applied, carrying .kc_la.tar.xz and .la.tar.xz
# from build2.sh): ab_round.sh's A/B against main, the failing tests' messages printed, and the tree's pipeline depths swept.
export PYTHONUNBUFFERED=1
KC=.kc_la TREES=.la BASE=.la_base timeout 420 bash docs/studies/prepare_frags/ab_round.sh > $OUT/ab_round.txt 2>&1
PYKDA_CACHE_DIR=$PWD/.kc_la PYTHONPATH=. timeout 150 python -m pykda bench kda --shapes 96:8192,8:131072,1:1048576 \
  --stages 3,4,5,6 > $OUT/stages.txt 2>&1
grep -v "%|" $OUT/stages.txt | tail -30
grep -E "^(FAILED|ERROR)|Error|assert" $OUT/tests.txt | head -20
tail -16 $OUT/ab_round.txt
echo "done at ${SECONDS}s"
