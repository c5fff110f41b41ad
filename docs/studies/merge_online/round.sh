#!/bin/bash
# Device round (repository root; carry .kc_mg.tar.xz (this tree's decode kernels) and .ab_main.tar.xz (main's
# pykda, templates, src and their decode kernels in .kc_main)): this tree's decode GPU tests, main / this tree
# over ab.py (a second alternation while under $1 seconds, default 200), the table, then the sanitize list's
# merge entries under memcheck and racecheck for at most $2 seconds (default 170).
source docs/studies/merge_online/prelude.sh .kc_mg .ab_main \
  tests/test_decode_gpu.py tests/test_batch_decode_gpu.py tests/test_paged_decode_gpu.py
runs=()
for i in 1 2; do
  [ $i -gt 1 ] && [ $SECONDS -gt ${1:-200} ] && break
  (cd .ab_main && PYKDA_CACHE_DIR=$PWD/.kc_main PYTHONPATH=. python ../docs/studies/merge_online/ab.py $OUT/main_$i) > $OUT/main_$i.log 2>&1
  PYKDA_CACHE_DIR=$PWD/.kc_mg PYTHONPATH=. python docs/studies/merge_online/ab.py $OUT/online_$i > $OUT/online_$i.log 2>&1
  runs+=($OUT/main_$i $OUT/online_$i)
  echo "alternation $i done at ${SECONDS}s"
done
PYTHONPATH=. python docs/studies/merge_online/ab.py --table "${runs[@]}" | tee $OUT/table.txt
PYKDA_CACHE_DIR=$PWD/.kc_mg PYTHONPATH=. timeout ${2:-170} python -m pykda sanitize --tool memcheck,racecheck \
  --pytest-args "-k 'merge or planner_overrides or balanced'" 2>&1 | tail -4 | tee $OUT/sanitize.txt
