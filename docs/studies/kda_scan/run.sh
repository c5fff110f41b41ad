#!/bin/bash
# x_planes.patch on the H200 in one call (~170 s): from the checkout's root, after
#   mkdir -p ab/head && git archive HEAD pykda templates src | tar -x -C ab/head
#   git apply docs/studies/kda_scan/x_planes.patch
# and a kernel cache of both trees (PYKDA_CACHE_DIR). Outputs bit-identical, kernel times A/B,
# the segment and CP GPU tests, memcheck and racecheck of their sanitize cases.
export PYKDA_CACHE_DIR=${PYKDA_CACHE_DIR:-$PWD/.kc} PYTHONUNBUFFERED=1
S=docs/studies/kda_scan
PYTHONPATH=$PWD/ab/head python $S/exact.py head 2>&1 | tail -1
PYTHONPATH=$PWD python $S/exact.py new 2>&1 | tail -1
PYTHONPATH=$PWD python $S/exact.py cmp | tee $OUT/exact.txt
for rep in 1 2; do
  echo "## head"; PYTHONPATH=$PWD/ab/head python $S/kernels.py short 2>&1 | grep "^H="
  echo "## new"; PYTHONPATH=$PWD python $S/kernels.py short 2>&1 | grep "^H="
done | tee $OUT/kernels.txt
export PYTHONPATH=$PWD
timeout 120 python -m pytest -q -m gpu tests/test_kda_segments_gpu.py tests/test_kda_cp_gpu.py 2>&1 | tail -1 | tee $OUT/tests.txt
timeout 200 python -m pykda sanitize --tool memcheck,racecheck --log-dir $OUT/san \
  --pytest-args='-k "segments or cp_gpu"' 2>&1 | grep -E "^(memcheck|racecheck) " | tee $OUT/san.txt
echo "=== summary"; cat $OUT/exact.txt $OUT/kernels.txt $OUT/tests.txt $OUT/san.txt
