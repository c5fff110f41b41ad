# Session 47, for streams_rule.patch (not run: the device time ran out). From the repository root with the
# patch applied (`git apply docs/studies/decode_tiny/streams_rule.patch`) and its kernels compiled into
# .kc_47 (`PYKDA_CACHE_DIR=.kc_47 python -m pykda compile --family decode`, packed as .kc_47.tar.xz),
# ~1.5 min on any card: decode_tiny's tests and the single decode's, memcheck and racecheck of
# decode_tiny's test. Carry [".kc_47.tar.xz"]. Then ab.py (round.sh) for the patch's planner.
[ -d .kc_47 ] || tar xJf .kc_47.tar.xz
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_47
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_batch_decode_gpu.py tests/test_decode_gpu.py \
  -k "tiny or matches_reference" > $OUT/tiny_tests.log 2>&1
grep -E "passed|failed" $OUT/tiny_tests.log | tail -1; grep -E "^E  " $OUT/tiny_tests.log | head -10
timeout 80 python -m pykda sanitize --tool memcheck,racecheck --shards 2 --timeout 70 --pytest-args "-k tiny" \
  --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-250
