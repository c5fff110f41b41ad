# Session 43, from the repository root (~6 min): head dim 128 at 4 stages for calls of at most an SM's
# units (FEW_UNITS_STAGES). The decode GPU files, both grids (FlashInfer, cuDNN beside), then memcheck and
# racecheck over the decode sanitize list's head dim 128 tests (the ones that now run 4-stage kernels).
# Carry [".kc_s43.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"]: this tree's decode kernels, plain and
# sanitize builds (`PYKDA_CACHE_DIR=.kc_s43 python -m pykda compile --family decode`, the same with
# PYKDA_SANITIZE=1, packed `tar cf - .kc_s43 | xz > .kc_s43.tar.xz`), the peers, FlashInfer's JIT cache.
[ -d .kc_s43 ] || tar xJf .kc_s43.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_s43
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py \
  tests/test_batch_decode_gpu.py tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" \
  > $OUT/gpu_tests.log 2>&1
timeout 110 python -m pykda bench decode --grid --max-seconds 95 --json $OUT/grid.json > $OUT/grid.log 2>&1
timeout 60 python -m pykda bench paged-decode --grid --max-seconds 50 > $OUT/paged.log 2>&1
timeout 200 python -m pykda sanitize --tool memcheck,racecheck --shards 8 --timeout 95 \
  --pytest-args "-k 'decode and not kda and 128'" --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "passed|failed" $OUT/gpu_tests.log | tail -2; grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-300
grep -E "^grid:|copy:" $OUT/grid.log | cut -c1-1200; grep -E "^paged grid" $OUT/paged.log | cut -c1-900
