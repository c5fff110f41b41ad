#!/bin/bash
# The shortest device round (as round.sh, same carries): the box-major and pages-of-16 GPU tests, one
# main / this tree alternation over ab.py and its table; no sanitizer.
set -o pipefail
export PYTHONUNBUFFERED=1
tar xJf .kc_bm.tar.xz && tar xJf .ab_main.tar.xz || exit 1
PYKDA_CACHE_DIR=$PWD/.kc_bm PYTHONPATH=. timeout 60 python -m pytest -q -x -p no:cacheprovider -m gpu \
  tests/test_paged_decode_gpu.py -k "box_major or 16" 2>&1 | tail -2 | tee $OUT/tests.txt
(cd .ab_main && PYKDA_CACHE_DIR=$PWD/.kc_main PYTHONPATH=. timeout 60 python ../docs/studies/box_major/ab.py $OUT/main_1.json) > $OUT/main_1.log 2>&1
PYKDA_CACHE_DIR=$PWD/.kc_bm PYTHONPATH=. timeout 60 python docs/studies/box_major/ab.py $OUT/bm_1.json 2>&1 | tee $OUT/bm_1.log | tail -3
python docs/studies/box_major/ab.py --table $OUT/main_1.json $OUT/bm_1.json | tee $OUT/table.txt
