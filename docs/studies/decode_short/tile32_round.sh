# Branch wip/tile32 on the device in one call (~6 min), from the repository root. Build the cache
# first: `PYKDA_CACHE_DIR=.kc_dec python -m pykda compile --family decode` and the same with
# PYKDA_SANITIZE=1, `tar cf - .kc_dec | xz > .kc_dec.tar.xz`. Carry [".kc_dec.tar.xz", ".peers.tar.xz",
# ".fi_ws.tar.xz"].
tar xJf .kc_dec.tar.xz; tar xJf .peers.tar.xz
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_dec
mkdir -p $OUT
[ -f .fi_ws.tar.xz ] && tar xJf .fi_ws.tar.xz -C /tmp
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
timeout 250 python -m pykda sanitize --tool memcheck,racecheck --shards 8 --timeout 110 \
  --pytest-args "-k 'decode and not kda'" --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
timeout 80 python docs/studies/decode_short/knobs.py > $OUT/knobs.log 2>&1
timeout 110 python -m pykda bench decode --grid --max-seconds 95 --json $OUT/grid.json > $OUT/grid.log 2>&1
grep -E "passed|failed|error" $OUT/gpu_tests.log | tail -3; tail -3 $OUT/sanitize.log
grep -v "Warn\|warn\|return torch" $OUT/knobs.log; grep -v "Warn\|warn\|return torch\|bench decode:" $OUT/grid.log | tail -3
