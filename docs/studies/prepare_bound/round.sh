#!/bin/bash
# Session 68: l2_reads.py on main on any GPU (one H100 answer is informative too), then, on an H200
# only, the pipelined kda_prepare's round with the owed sweeps (prepare_pipelined/h200_round.sh, which
# stops at once elsewhere). Run from the repository root with the pipelined patch applied, carrying
# .kc_pp.tar.xz and .pp.tar.xz (their build: docs/studies/prepare_pipelined/README.md); ~30 s of GPU work
# before the H200 round's ~250 s.
set -o pipefail
export PYTHONUNBUFFERED=1
tar xJf .kc_pp.tar.xz && tar xJf .pp.tar.xz || exit 1
(cd .pp_base && PYKDA_CACHE_DIR=$OLDPWD/.kc_pp PYTHONPATH=. timeout 150 \
  python $OLDPWD/docs/studies/prepare_bound/l2_reads.py) 2>&1 | tee $OUT/l2_reads.txt
echo "l2_reads at ${SECONDS}s"
bash docs/studies/prepare_pipelined/h200_round.sh
