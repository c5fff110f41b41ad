#!/bin/bash
# Device round of session 60 (repository root; carry .kc_60.tar.xz (this tree's decode kernels) and
# .ab_818.tar.xz (main at 818ce0c: its pykda, templates, src and their decode kernels in .kc_main)): the
# cluster merge through merge_into and decode_merge's unit rows read from its row count. This tree's
# decode GPU tests; main / this tree over ab.py's decode_merge rows (one alternation) and its cluster
# rows (two); the table; memcheck and racecheck over the sanitize list's merge, balanced and cluster
# entries for at most $1 seconds (default 200).
source docs/studies/merge_online/prelude.sh .kc_60 .ab_818 \
  tests/test_decode_gpu.py tests/test_batch_decode_gpu.py tests/test_paged_decode_gpu.py
ab() {   # ab NAME [--cluster]: main, then this tree
  (cd .ab_818 && PYKDA_CACHE_DIR=$PWD/.kc_main PYTHONPATH=. python ../docs/studies/merge_online/ab.py $OUT/main_$1 $2) \
    > $OUT/main_$1.log 2>&1
  PYKDA_CACHE_DIR=$PWD/.kc_60 PYTHONPATH=. python docs/studies/merge_online/ab.py $OUT/tree_$1 $2 > $OUT/tree_$1.log 2>&1
  echo "$1 done at ${SECONDS}s"
}
ab merge; ab cluster_1 --cluster; ab cluster_2 --cluster
PYTHONPATH=. python docs/studies/merge_online/ab.py --table $OUT/main_merge $OUT/tree_merge > $OUT/table_merge.txt 2>&1
PYTHONPATH=. python docs/studies/merge_online/ab.py --table $OUT/main_cluster_1 $OUT/tree_cluster_1 $OUT/main_cluster_2 \
  $OUT/tree_cluster_2 > $OUT/table_cluster.txt 2>&1
PYKDA_CACHE_DIR=$PWD/.kc_60 PYTHONPATH=. timeout ${1:-200} python -m pykda sanitize --tool memcheck,racecheck \
  --pytest-args "-k 'merge or balanced or clusters'" 2>&1 | tail -4 > $OUT/sanitize.txt
cat $OUT/tests.txt; tail -3 $OUT/table_merge.txt; cat $OUT/table_cluster.txt; cat $OUT/sanitize.txt
