#!/bin/bash
# Session 66's third device call (~380 s; this tree, carrying .kc_la.tar.xz and .la.tar.xz from build3.sh):
# ab_round.sh against main with .la_r4 and .la_nor timed once each, the failing tests' messages printed.
export PYTHONUNBUFFERED=1
KC=.kc_la TREES=.la BASE=.la_base EXTRA=".la_r4 .la_nor" timeout 500 bash docs/studies/prepare_frags/ab_round.sh \
  > $OUT/ab_round.txt 2>&1
grep -E "^(FAILED|ERROR)|Error|assert" $OUT/tests.txt | head -20
tail -16 $OUT/ab_round.txt
echo "done at ${SECONDS}s"
