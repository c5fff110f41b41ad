#!/bin/bash
# kda_prepare at seven CTAs an SM (seven_ctas.patch applied to this tree) against main (.po_main) and the
# patch at six (.po_six: the layout alone): the tree's KDA GPU tests, kda_prepare µs and the call's span
# at issue 12's rows (prepare_frags/times.py, main and the tree alternated twice), the outputs compared
# with main's, memcheck and racecheck of the KDA sanitize cases. Carry .kc_po.tar.xz (the three trees'
# kda kernels) and .po.tar.xz (.po_main, .po_six); the README says how.
set -o pipefail
export PYTHONUNBUFFERED=1
tar xJf .kc_po.tar.xz && tar xJf .po.tar.xz || exit 1
export PYKDA_CACHE_DIR=$PWD/.kc_po
nvidia-smi --query-gpu=name --format=csv,noheader
T=docs/studies/prepare_frags/times.py
PYTHONPATH=. timeout 150 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_kda_gpu.py \
  tests/test_kda_segments_gpu.py 2>&1 | tail -3 | tee $OUT/tests.txt
echo "tests at ${SECONDS}s"
mkdir -p $OUT/o_main $OUT/o_tree
for round in 1 2; do
  save_m=""; save_t=""; [ $round = 1 ] && save_m="--save $OUT/o_main" && save_t="--save $OUT/o_tree"
  (cd .po_main && PYTHONPATH=. timeout 60 python $OLDPWD/$T $save_m) > $OUT/main_$round.txt 2>&1
  PYTHONPATH=. timeout 60 python $T $save_t > $OUT/tree_$round.txt 2>&1
done
(cd .po_six && PYTHONPATH=. timeout 60 python $OLDPWD/$T) > $OUT/six_1.txt 2>&1
echo "times at ${SECONDS}s"
PYTHONPATH=. python docs/studies/prepare_frags/compare.py $OUT/o_tree $OUT/o_main > $OUT/compare.txt 2>&1
for f in $OUT/main_1.txt $OUT/tree_1.txt $OUT/main_2.txt $OUT/tree_2.txt $OUT/six_1.txt; do
  echo "== $f"; grep -v "profiler\|_warn_once" $f; done
cat $OUT/compare.txt
PYTHONPATH=. timeout 200 python -m pykda sanitize --tool memcheck,racecheck --shards 4 --timeout 90 \
  --log-dir $OUT/san --pytest-args="-k 'kda and not decode'" 2>&1 | tail -4
echo "done at ${SECONDS}s"
