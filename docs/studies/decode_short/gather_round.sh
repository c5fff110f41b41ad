# Session 46, from the repository root with gather.patch applied (~3 min, any card): the gathered
# padded rows' GPU test, tiny.py twice (padded by TMA, padded gathered, paged on pages of one row,
# FlashInfer), memcheck and racecheck of the gathered test, then the decode GPU files.
# Carry [".kc_s43.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"] (see h200_round.sh).
[ -d .kc_s43 ] || tar xJf .kc_s43.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_s43
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_batch_decode_gpu.py -k gathered > $OUT/gathered.log 2>&1
grep -E "passed|failed" $OUT/gathered.log | tail -1; grep -E "^E  " $OUT/gathered.log | head -10
for r in 1 2; do timeout 100 python docs/studies/decode_short/tiny.py > $OUT/tiny_$r.log 2>&1; done
timeout 150 python -m pykda sanitize --tool memcheck,racecheck --shards 1 --timeout 140 --pytest-args "-k gathered" \
  --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-250
timeout 90 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
grep -E "passed|failed" $OUT/gpu_tests.log | tail -1
grep -v Warn $OUT/tiny_1.log | tail -11; grep -v Warn $OUT/tiny_2.log | tail -11
