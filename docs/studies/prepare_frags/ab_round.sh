#!/bin/bash
# A kda_prepare A/B on the device (repository root): this tree against a base tree, with the tree's KDA
# GPU tests, kda_prepare µs and the call's span at issue 12's rows (prepare_frags/times.py, base and tree
# alternated three times, each EXTRA tree once), the outputs compared with the base's, memcheck and
# racecheck of the KDA cases, a table of the ratios to the base last. Each study's README says how to
# build its two tarballs and which environment to give:
#   KC     the kernel cache every tree compiles into, carried as $KC.tar.xz
#   TREES  the other trees' directories, carried as $TREES.tar.xz
#   BASE   the base tree's directory
#   EXTRA  more directories, timed once each (optional)
set -o pipefail
export PYTHONUNBUFFERED=1
: "${KC:?KC: the kernel cache}" "${TREES:?TREES: the trees tarball}" "${BASE:?BASE: the base tree}"; EXTRA=${EXTRA:-}
tar xJf $KC.tar.xz && tar xJf $TREES.tar.xz || exit 1
export PYKDA_CACHE_DIR=$PWD/$KC
nvidia-smi --query-gpu=name --format=csv,noheader
T=docs/studies/prepare_frags/times.py
PYTHONPATH=. timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kda_gpu.py \
  tests/test_kda_segments_gpu.py > $OUT/tests.txt 2>&1; tail -1 $OUT/tests.txt
mkdir -p $OUT/o_base $OUT/o_tree
for round in 1 2 3; do
  save_b=""; save_t=""; [ $round = 1 ] && save_b="--save $OUT/o_base" && save_t="--save $OUT/o_tree"
  (cd $BASE && PYTHONPATH=. timeout 60 python $OLDPWD/$T $save_b) > $OUT/base_$round.txt 2>&1
  PYTHONPATH=. timeout 60 python $T $save_t > $OUT/tree_$round.txt 2>&1
done
for e in $EXTRA; do (cd $e && PYTHONPATH=. timeout 60 python $OLDPWD/$T) > $OUT/extra${e}_1.txt 2>&1; done
echo "times at ${SECONDS}s"
PYTHONPATH=. python docs/studies/prepare_frags/compare.py $OUT/o_tree $OUT/o_base > $OUT/compare.txt 2>&1
rm -rf $OUT/o_base $OUT/o_tree
PYTHONPATH=. timeout 200 python -m pykda sanitize --tool memcheck,racecheck --shards 4 --timeout 90 \
  --log-dir $OUT/san --pytest-args="-k 'kda and not decode'" 2>&1 | tail -3
python docs/studies/prepare_frags/ratios.py $OUT
grep -c "0.00e+00" $OUT/compare.txt; grep -v "0.00e+00" $OUT/compare.txt | head -5
echo "done at ${SECONDS}s"
