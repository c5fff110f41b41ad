# Session 42 on the device, from the repository root: the decode GPU files, memcheck and racecheck
# over the decode sanitize list, then knobs.py on the tree before (`.base/pykda`: chunks of one tile
# in boxes, with its kernel cache `.kc_wip32`) and on this one (every chunk's last, partial tile in
# boxes through the tail maps). Build this tree's cache first: `PYKDA_CACHE_DIR=.kc_new python -m
# pykda compile --family decode`, the same with PYKDA_SANITIZE=1, `tar cf - .kc_new | xz >
# .kc_new.tar.xz`. Carry [".base", ".kc_wip32.tar.xz", ".kc_new.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"].
for c in .kc_wip32 .kc_new; do [ -d $c ] || tar xJf $c.tar.xz; done
[ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=.:$PYTHONPATH
PYKDA_CACHE_DIR=$PWD/.kc_new timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py \
  tests/test_batch_decode_gpu.py tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" \
  > $OUT/gpu_tests.log 2>&1
PYKDA_CACHE_DIR=$PWD/.kc_new timeout 330 python -m pykda sanitize --tool memcheck,racecheck --shards 8 --timeout 200 \
  --pytest-args "-k 'decode and not kda'" --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
PYTHONPATH=.base:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_wip32 timeout 80 python docs/studies/decode_short/knobs.py \
  > $OUT/knobs_base.log 2>&1
PYKDA_CACHE_DIR=$PWD/.kc_new timeout 80 python docs/studies/decode_short/knobs.py > $OUT/knobs.log 2>&1
grep -E "passed|failed" $OUT/gpu_tests.log | tail -2; grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-300
grep -v "Warn\|warn\|return torch" $OUT/knobs_base.log; grep -v "Warn\|warn\|return torch" $OUT/knobs.log
