# Meant for the H200, from the repository root (~5 min): the decode GPU files, then memcheck and
# racecheck over the decode sanitize list (12 shards: the slowest racecheck shard took 237 s on an
# H100). Session 43 ran it on main at d16ca1c (an H100 came: `317 passed`, both tools PASS over 25
# tests) with that tree's cache; for later trees build `.kc_s43` as land_round.sh in
# docs/studies/decode_long_h100/ says. Carry [".kc_s43.tar.xz"].
[ -d .kc_s43 ] || tar xJf .kc_s43.tar.xz
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_s43
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py \
  tests/test_batch_decode_gpu.py tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" \
  > $OUT/gpu_tests.log 2>&1
timeout 450 python -m pykda sanitize --tool memcheck,racecheck --shards 12 --timeout 300 \
  --pytest-args "-k 'decode and not kda'" --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "passed|failed" $OUT/gpu_tests.log | tail -2; grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-300
