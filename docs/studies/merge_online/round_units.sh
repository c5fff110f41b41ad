#!/bin/bash
# Device round for the balanced merge's rows by unit (repository root; carry .kc_mu.tar.xz (this tree's decode
# kernels) and .ab_prev.tar.xz (the tree before: pykda, templates, src, its kernels in .kc_prev)): this tree's
# padded-batch and paged GPU tests, the tree before / this tree alternated twice over ab.py --balanced and
# paged_placement/fi_row.py (2 x 64/4 KV 500000, padded and pages of 64), then the sanitize list's balanced
# entries under memcheck and racecheck. $1: alternations (default 2); $2: the sanitizer tools (default both).
source docs/studies/merge_online/prelude.sh .kc_mu .ab_prev tests/test_batch_decode_gpu.py tests/test_paged_decode_gpu.py
runs=()
for i in $(seq 1 ${1:-2}); do
  (cd .ab_prev && PYKDA_CACHE_DIR=$PWD/.kc_prev PYTHONPATH=. python ../docs/studies/merge_online/ab.py $OUT/prev_$i --balanced \
    && PYKDA_CACHE_DIR=$PWD/.kc_prev PYTHONPATH=. python fi_row.py 64) > $OUT/prev_$i.log 2>&1
  (PYKDA_CACHE_DIR=$PWD/.kc_mu PYTHONPATH=. python docs/studies/merge_online/ab.py $OUT/units_$i --balanced \
    && PYKDA_CACHE_DIR=$PWD/.kc_mu PYTHONPATH=. python docs/studies/paged_placement/fi_row.py 64) > $OUT/units_$i.log 2>&1
  runs+=($OUT/prev_$i $OUT/units_$i)
  grep -h "pykda" $OUT/prev_$i.log $OUT/units_$i.log
  echo "alternation $i done at ${SECONDS}s"
done
PYTHONPATH=. python docs/studies/merge_online/ab.py --table "${runs[@]}" | tee $OUT/table.txt
PYKDA_CACHE_DIR=$PWD/.kc_mu PYTHONPATH=. timeout 200 python -m pykda sanitize --tool ${2:-memcheck,racecheck} \
  --pytest-args "-k 'balanced'" 2>&1 | grep -E "PASS|FAIL|clean" | tee $OUT/sanitize.txt
