# Branch wip/tile32 (landed in session 42) on the device, from the repository root, in two calls: `bash tile32_round.sh check`
# (~6 min: the decode GPU files, memcheck and racecheck over the decode sanitize list) and `bash
# tile32_round.sh time` (~4 min: knobs.py, the decode grid and the paged grid beside FlashInfer).
# The branch: one-tile CTAs of sequences within 32 rows in tiles of 32 (ONE_TILE_SHORT_ROWS), and
# paged TMA boxes wholly past a request's end not read (they reread its last page). Build the cache
# first (session 41 left it packed in the main checkout, if still there): `PYKDA_CACHE_DIR=.kc_wip32
# python -m pykda compile --family decode`, the same with
# PYKDA_SANITIZE=1, then `tar cf - .kc_wip32 | xz > .kc_wip32.tar.xz`. Carry [".kc_wip32.tar.xz",
# ".peers.tar.xz", ".fi_ws.tar.xz"].
[ -d .kc_wip32 ] || tar xJf .kc_wip32.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_wip32
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = check ]; then
  timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
    tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
  timeout 250 python -m pykda sanitize --tool memcheck,racecheck --shards 8 --timeout 115 \
    --pytest-args "-k 'decode and not kda'" --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
  grep -E "passed|failed|error" $OUT/gpu_tests.log | tail -3; tail -3 $OUT/sanitize.log
else
  [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
  timeout 80 python docs/studies/decode_short/knobs.py > $OUT/knobs.log 2>&1
  timeout 110 python -m pykda bench decode --grid --max-seconds 95 --json $OUT/grid.json > $OUT/grid.log 2>&1
  timeout 60 python -m pykda bench paged-decode --grid --max-seconds 50 --json $OUT/paged.json > $OUT/paged.log 2>&1
  grep -v "Warn\|warn\|return torch" $OUT/knobs.log
  grep -v "Warn\|warn\|return torch\|bench decode:" $OUT/grid.log | tail -3; tail -3 $OUT/paged.log
fi
