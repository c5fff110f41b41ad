# Session 47, from the repository root (~1.5 min, any card): after the streams rule, decode_tiny's tests
# and the single decode's short rows, memcheck and racecheck of decode_tiny's test. Carry [".kc_47.tar.xz"].
[ -d .kc_47 ] || tar xJf .kc_47.tar.xz
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_47
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_batch_decode_gpu.py tests/test_decode_gpu.py \
  -k "tiny or matches_reference" > $OUT/tiny_tests.log 2>&1
grep -E "passed|failed" $OUT/tiny_tests.log | tail -1; grep -E "^E  " $OUT/tiny_tests.log | head -10
timeout 80 python -m pykda sanitize --tool memcheck,racecheck --shards 2 --timeout 70 --pytest-args "-k tiny" \
  --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-250
