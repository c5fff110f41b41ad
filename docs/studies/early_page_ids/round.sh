#!/bin/bash
# Device round (repository root; carry .kc_sg.tar.xz (this tree's decode kernels) and .ab_head.tar.xz (the
# tree before: its pykda, templates, src under .ab_head/ and its decode kernels in .ab_head/.kc)): this
# tree's decode, padded-batch and paged GPU tests, then docs/studies/paged_one_tile/ab.py (one-tile rows
# on pages of 16, 64, 128) and its `gathers` rows, the tree before and this one alternated $2 times (default
# 2), then memcheck and racecheck of the sanitize list's one-tile and pages-of-16 tests for at most $1 s
# (default 150).
set -o pipefail
export PYTHONUNBUFFERED=1
tar xJf .kc_sg.tar.xz && tar xJf .ab_head.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
PYKDA_CACHE_DIR=$PWD/.kc_sg PYTHONPATH=. timeout 150 python -m pytest -q -x -p no:cacheprovider -m gpu \
  tests/test_decode_gpu.py tests/test_batch_decode_gpu.py tests/test_paged_decode_gpu.py 2>&1 | tail -2 | tee $OUT/tests.txt
for i in $(seq 1 ${2:-2}); do
  for mode in "" gathers; do
    (cd .ab_head && PYKDA_CACHE_DIR=$PWD/.kc PYTHONPATH=. python ../docs/studies/paged_one_tile/ab.py $mode) > $OUT/before_${i}${mode}.txt 2>&1
    PYKDA_CACHE_DIR=$PWD/.kc_sg PYTHONPATH=. python docs/studies/paged_one_tile/ab.py $mode > $OUT/after_${i}${mode}.txt 2>&1
  done
  echo "alternation $i done at ${SECONDS}s"
done
for f in $OUT/before_* $OUT/after_*; do echo "== $(basename $f)"; grep -v "^ *shape" $f | cut -c1-75; done
PYKDA_CACHE_DIR=$PWD/.kc_sg PYTHONPATH=. timeout ${1:-150} python -m pykda sanitize --tool memcheck,racecheck \
  --pytest-args "-k 'one_tile or (paged_decode and 16)'" 2>&1 | tail -3 | tee $OUT/sanitize.txt
