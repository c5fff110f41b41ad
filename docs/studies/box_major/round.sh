#!/bin/bash
# Device round (repository root; carry .kc_bm.tar.xz (this tree's decode kernels) and .ab_main.tar.xz
# (main's pykda, templates, src and their decode kernels)): this tree's paged GPU tests, main / this
# tree over ab.py (a second alternation while under $1 seconds, default 200), the table, then the
# sanitize list's pages of 16 under memcheck and racecheck for at most $2 seconds (default 170; NHD D 128
# chunks, HND D 256, the balanced split).
set -o pipefail
export PYTHONUNBUFFERED=1
BUDGET=${1:-200}
tar xJf .kc_bm.tar.xz && tar xJf .ab_main.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
PYKDA_CACHE_DIR=$PWD/.kc_bm PYTHONPATH=. timeout 150 python -m pytest -q -x -p no:cacheprovider -m gpu \
  tests/test_paged_decode_gpu.py 2>&1 | tail -3 | tee $OUT/tests.txt
runs=()
for i in 1 2; do
  [ $i -gt 1 ] && [ $SECONDS -gt $BUDGET ] && break
  (cd .ab_main && PYKDA_CACHE_DIR=$PWD/.kc_main PYTHONPATH=. python ../docs/studies/box_major/ab.py $OUT/main_$i.json) > $OUT/main_$i.log 2>&1
  PYKDA_CACHE_DIR=$PWD/.kc_bm PYTHONPATH=. python docs/studies/box_major/ab.py $OUT/bm_$i.json > $OUT/bm_$i.log 2>&1
  runs+=($OUT/main_$i.json $OUT/bm_$i.json)
  echo "alternation $i done at ${SECONDS}s"
done
python docs/studies/box_major/ab.py --table "${runs[@]}" | tee $OUT/table.txt
PYKDA_CACHE_DIR=$PWD/.kc_bm PYTHONPATH=. timeout ${2:-170} python -m pykda sanitize --tool memcheck,racecheck \
  --pytest-args "-k 'paged_decode and 16'" 2>&1 | tail -4 | tee $OUT/sanitize.txt
