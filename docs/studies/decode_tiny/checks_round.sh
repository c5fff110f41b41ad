# Session 47, from the repository root (~2 min, any card): after the streams rule, decode_tiny's tests,
# memcheck and racecheck of them, the decode GPU files. Carry [".kc_47.tar.xz"].
[ -d .kc_47 ] || tar xJf .kc_47.tar.xz
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_47
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_batch_decode_gpu.py tests/test_decode_gpu.py \
  -k "tiny or S1 or 15- or 1-" > $OUT/tiny_tests.log 2>&1
grep -E "passed|failed" $OUT/tiny_tests.log | tail -1; grep -E "^E  " $OUT/tiny_tests.log | head -10
timeout 200 python -m pykda sanitize --tool memcheck,racecheck --shards 2 --timeout 180 --pytest-args "-k tiny" \
  --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-250
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
grep -E "passed|failed" $OUT/gpu_tests.log | tail -1; grep -E "^(E  |FAILED)" $OUT/gpu_tests.log | head -10
