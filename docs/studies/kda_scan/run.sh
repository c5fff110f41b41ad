#!/bin/bash
# The scan patches on the H200 in one call (~250 s), from the checkout's root, after
#   mkdir -p ab/head ab/xp ab/ks && git archive HEAD pykda templates src | tar -x -C ab/head
#   git apply docs/studies/kda_scan/x_planes.patch && cp -r pykda templates src ab/xp/
#   git apply docs/studies/kda_scan/k_split.patch && cp -r pykda templates src ab/ks/
#   git apply docs/studies/kda_scan/m_planes.patch
# and a kernel cache of the four trees (PYKDA_CACHE_DIR; `python -m pykda compile --family kda`
# with PYTHONPATH at each). Outputs (xp bit-identical to head; ks within fp32 rounding; mp
# bit-identical to ks), kernel times, the segment and CP GPU tests and memcheck + racecheck of
# their sanitize cases on the checkout (all three patches).
export PYKDA_CACHE_DIR=${PYKDA_CACHE_DIR:-$PWD/.kc} PYTHONUNBUFFERED=1
S=docs/studies/kda_scan
for t in head xp ks; do PYTHONPATH=$PWD/ab/$t python $S/exact.py $t 2>&1 | tail -1; done
PYTHONPATH=$PWD python $S/exact.py mp 2>&1 | tail -1
for pair in "head xp" "head ks" "ks mp"; do PYTHONPATH=$PWD python $S/exact.py cmp $pair; done | tee $OUT/exact.txt
for rep in 1 2; do
  for t in head xp ks; do echo "## $t"; PYTHONPATH=$PWD/ab/$t python $S/kernels.py short 2>&1 | grep "^H="; done
  echo "## mp"; PYTHONPATH=$PWD python $S/kernels.py short 2>&1 | grep "^H="
done | tee $OUT/kernels.txt
export PYTHONPATH=$PWD
timeout 120 python -m pytest -q -m gpu tests/test_kda_segments_gpu.py tests/test_kda_cp_gpu.py 2>&1 | tail -1 | tee $OUT/tests.txt
timeout 200 python -m pykda sanitize --tool memcheck,racecheck --log-dir $OUT/san \
  --pytest-args='-k "segments or cp_gpu"' 2>&1 | grep -E "^(memcheck|racecheck) " | tee $OUT/san.txt
echo "=== summary"; cat $OUT/exact.txt $OUT/kernels.txt $OUT/tests.txt $OUT/san.txt
