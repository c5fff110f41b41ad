# The transposed decode's landing, GPU half (one device call, ~8 min), from the repository root.
# Carry [".kc_t"]: every registry decode kernel (602), prebuilt offline by NVRTC 13.0
# (PYKDA_CACHE_DIR=.kc_t python -m pykda compile --family decode).
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_t
mkdir -p $OUT
# 1. the decode GPU files (float64 references; awkward lengths, pages, splits, clusters, graphs)
timeout 300 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
# 2. racecheck and memcheck over the sanitize list's decode tests
timeout 220 python -m pykda sanitize --tool racecheck,memcheck --timeout 105 --pytest-args "-k 'decode and not kda'" \
  --log-dir $OUT/sanitize > $OUT/sanitize.log 2>&1
grep -E "passed|failed|error" $OUT/gpu_tests.log | tail -3; tail -8 $OUT/sanitize.log
