#!/bin/bash
# Device round (repository root; carry .peers and .kc_bm.tar.xz, main's decode kernels): the read floor,
# then main's decode GPU tests, and the paged and padded decode grids beside FlashInfer (each cut at
# --max-seconds), every log under $OUT, the summary lines last.
set -o pipefail
export PYTHONUNBUFFERED=1
tar xJf .kc_bm.tar.xz || exit 1
source .peers/activate.sh
export PYKDA_CACHE_DIR=$PWD/.kc_bm PYTHONPATH=.:$PYTHONPATH
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
python docs/studies/read_floor/read_floor.py > $OUT/read_floor.txt 2>&1; tail -10 $OUT/read_floor.txt
timeout 200 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py > $OUT/tests.txt 2>&1; tail -2 $OUT/tests.txt; echo "tests done at ${SECONDS}s"
python -m pykda bench paged-decode --grid --max-seconds ${1:-120} > $OUT/paged_grid.txt 2>&1; echo "paged grid done at ${SECONDS}s"
python -m pykda bench decode --grid --max-seconds ${2:-150} > $OUT/decode_grid.txt 2>&1; echo "decode grid done at ${SECONDS}s"
grep -E "^paged grid|stopped after" $OUT/paged_grid.txt
grep -E "^grid|worst|stopped after" $OUT/decode_grid.txt | tail -4
