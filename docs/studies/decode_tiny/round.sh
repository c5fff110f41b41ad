# Session 47, from the repository root (~6 min, any card): the decode GPU files (decode_tiny's test
# among them), memcheck and racecheck of decode_tiny's tests, ab.py twice. Carry [".kc_47.tar.xz",
# ".peers.tar.xz"] (`PYKDA_CACHE_DIR=.kc_47 python -m pykda compile --family decode`, packed;
# `../shared/tools/stage-peers.sh`, packed); FlashInfer's JIT modules are built first (device_env.sh).
source docs/studies/flashinfer_warm/device_env.sh .kc_47
timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_batch_decode_gpu.py -k tiny > $OUT/tiny_tests.log 2>&1
grep -E "passed|failed" $OUT/tiny_tests.log | tail -1; grep -E "^E  " $OUT/tiny_tests.log | head -10
timeout 150 python -m pykda sanitize --tool memcheck,racecheck --shards 1 --timeout 140 --pytest-args "-k tiny" \
  --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-250
for r in 1 2; do timeout 150 python docs/studies/decode_tiny/ab.py > $OUT/ab_$r.log 2>&1; done
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
grep -E "passed|failed" $OUT/gpu_tests.log | tail -1; grep -E "^(E  |FAILED)" $OUT/gpu_tests.log | head -10
grep -v Warn $OUT/ab_1.log | tail -19; grep -v Warn $OUT/ab_2.log | tail -18
