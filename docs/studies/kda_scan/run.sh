#!/bin/bash
# k_split_tma.patch against HEAD on the H200 in one call (~200 s), from the checkout's root, after
#   mkdir -p ab/head && git archive HEAD pykda templates src | tar -x -C ab/head
#   git apply docs/studies/kda_scan/k_split_tma.patch
#   (cd ab/head && PYKDA_CACHE_DIR=../../.kc python -m pykda compile --family kda)
#   PYKDA_CACHE_DIR=$PWD/.kc python -m pykda compile --family kda
# (the tree's cache built from inside it: from the root, `-m` imports the checkout's pykda); carry
# `.kc`. Kernel times of both trees, two alternations, then the segment and CP GPU tests and
# memcheck + racecheck of their sanitize cases on the patched checkout. Outputs differ from HEAD
# by fp32 rounding (the k-halves are added at the end): the GPU tests judge them.
export PYKDA_CACHE_DIR=${PYKDA_CACHE_DIR:-$PWD/.kc} PYTHONUNBUFFERED=1
S=docs/studies/kda_scan
for rep in 1 2; do
  echo "## head"; PYTHONPATH=$PWD/ab/head python $S/kernels.py short 2>&1 | grep "^H="
  echo "## k split"; PYTHONPATH=$PWD python $S/kernels.py short 2>&1 | grep "^H="
done | tee $OUT/kernels.txt
export PYTHONPATH=$PWD
timeout 120 python -m pytest -q -m gpu tests/test_kda_segments_gpu.py tests/test_kda_cp_gpu.py 2>&1 | tail -1 | tee $OUT/tests.txt
timeout 150 python -m pykda sanitize --tool memcheck,racecheck --log-dir $OUT/san \
  --pytest-args='-k "segments or cp_gpu"' 2>&1 | grep -E "^(memcheck|racecheck) " | tee $OUT/san.txt
echo "=== summary"; cat $OUT/kernels.txt $OUT/tests.txt $OUT/san.txt
