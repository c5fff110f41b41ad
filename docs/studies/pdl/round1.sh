#!/bin/bash
# session 24 round 1: run.sh, then the GPU tests of every op the patch touches
export PYKDA_CACHE_DIR=$PWD/.kc PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash docs/studies/pdl/run.sh
timeout 300 python -m pytest -q -m gpu tests/test_kda_gpu.py tests/test_kda_segments_gpu.py tests/test_decode_gpu.py tests/test_batch_decode_gpu.py tests/test_paged_decode_gpu.py 2>&1 | tail -3 | tee $OUT/gpu.txt
echo "=== summary"; cat $OUT/exact.txt $OUT/graphs.txt $OUT/gpu.txt
