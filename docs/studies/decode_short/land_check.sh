# The landing's correctness alone in ~4.5 min (a device budget too short for land_round.sh), from the
# repository root. Carry [".kc_t.tar.xz"] (see land_round.sh).
tar xJf .kc_t.tar.xz
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_t
mkdir -p $OUT
timeout 165 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
timeout 100 python -m pykda sanitize --tool racecheck,memcheck --timeout 48 --pytest-args "-k 'decode and not kda'" \
  --log-dir $OUT/sanitize > $OUT/sanitize.log 2>&1
grep -E "passed|failed|error" $OUT/gpu_tests.log | tail -3; tail -6 $OUT/sanitize.log
