#!/bin/bash
# One device call (~550 s at most; repository root with lookahead.patch applied, carrying .kc_la.tar.xz and
# .la.tar.xz from build.sh): the lookahead A/B (the tree against main, pass 1 alone once; tests,
# compare, memcheck/racecheck), then docs/studies/h200_sweeps/'s planner sweeps on main's kernels.
set -o pipefail
export PYTHONUNBUFFERED=1
KC=.kc_la TREES=.la BASE=.la_base EXTRA=".la_p1" timeout 330 bash docs/studies/prepare_frags/ab_round.sh \
  > $OUT/ab_round.txt 2>&1
echo "ab_round at ${SECONDS}s"
KC=.kc_la TREE=.la_base bash docs/studies/h200_sweeps/round.sh
tail -16 $OUT/ab_round.txt
echo "done at ${SECONDS}s"
