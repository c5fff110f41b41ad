#!/bin/bash
# Session 65's device round (repository root, split_o.patch applied; carry .peers, .kc_so.tar.xz, .so.tar.xz):
# main's KDA GPU tests and `bench kda` with FlashKDA (GPU truth for 3f361d6), then the split_o A/B.
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
tar xJf .kc_so.tar.xz && tar xJf .so.tar.xz || exit 1
export PYKDA_CACHE_DIR=$PWD/.kc_so
(cd .so_base && PYTHONPATH=. timeout 150 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_kda_gpu.py \
  tests/test_kda_segments_gpu.py 2>&1 | tail -1) | tee $OUT/main_tests.txt
echo "main tests at ${SECONDS}s"
(source .peers/activate.sh; cd .so_base && PYTHONPATH=.:$PYTHONPATH timeout 200 python -m pykda bench kda \
  --shapes 96:8192,64:8192,16:65536,8:131072,4:262144,1:1048576,8:131072+1024x63) > $OUT/bench_kda.txt 2>&1
echo "bench at ${SECONDS}s"
KC=.kc_so TREES=.so BASE=.so_base EXTRA=".so_w4" timeout 300 bash docs/studies/prepare_frags/ab_round.sh > $OUT/ab_round.txt 2>&1
tail -16 $OUT/ab_round.txt
tail -32 $OUT/bench_kda.txt
echo "done at ${SECONDS}s"
