#!/bin/bash
# kda_prepare on register fragments (session 61), on a tree with prepare_frags.patch applied: its GPU
# tests, then kda_prepare's time and the call's span at issue 12's rows for main (.pv_base), the tree (six
# CTAs an SM at C = 16) and .pv_4 (the tree at four; .pv_5, five, is in the tarball too), then again the
# tree and main; the outputs compared with main's; memcheck and racecheck of the KDA sanitize cases.
# Carry .kc_pv.tar.xz (every tree's kda kernels) and .pv.tar.xz (the README says how to build both).
set -o pipefail
export PYTHONUNBUFFERED=1
tar xJf .kc_pv.tar.xz && tar xJf .pv.tar.xz || exit 1
export PYKDA_CACHE_DIR=$PWD/.kc_pv
nvidia-smi --query-gpu=name --format=csv,noheader
S=docs/studies/prepare_frags
PYTHONPATH=. timeout 100 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_kda_gpu.py \
  tests/test_kda_segments_gpu.py 2>&1 | tail -3 | tee $OUT/tests.txt
echo "tests at ${SECONDS}s"
mkdir -p $OUT/o_base $OUT/o_tree
for round in 1 2; do
  trees=".pv_base . .pv_4"; [ $round = 2 ] && trees=". .pv_base"
  for t in $trees; do
    save=""; [ $round = 1 ] && [ $t = .pv_base ] && save="--save $OUT/o_base"
    [ $round = 1 ] && [ $t = . ] && save="--save $OUT/o_tree"
    label=tree; [ $t = .pv_base ] && label=main; [ $t = .pv_4 ] && label=tree4; [ $t = .pv_5 ] && label=tree5
    (cd $t && PYTHONPATH=. timeout 60 python $OLDPWD/$S/times.py $save) > $OUT/${label}_$round.txt 2>&1
  done
done
echo "times at ${SECONDS}s"
PYTHONPATH=. python $S/compare.py $OUT/o_tree $OUT/o_base > $OUT/compare.txt 2>&1
for f in $OUT/*_1.txt $OUT/*_2.txt; do echo "== $f"; cat $f | cut -c1-100; done
cat $OUT/compare.txt
PYTHONPATH=. timeout 130 python -m pykda sanitize --tool memcheck,racecheck --shards 4 --timeout 60 \
  --log-dir $OUT/san --pytest-args="-k 'kda and not decode'" 2>&1 | tail -4
echo "done at ${SECONDS}s"
