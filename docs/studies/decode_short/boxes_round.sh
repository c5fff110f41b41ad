# Session 41's padded boxes (PADDED_BOX_ROWS) on the device in one call, from the repository root.
# Carry [".kc_all.tar.xz", ".kc_dec.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"]: every kernel (the decode
# ones rebuilt in .kc_dec, plain and PYKDA_SANITIZE), the peers, FlashInfer's JIT cache
# (docs/studies/flashinfer_warm/).
[ -d .kc_all ] || tar xJf .kc_all.tar.xz; tar xJf .kc_dec.tar.xz && cp .kc_dec/* .kc_all/
[ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_all
mkdir -p $OUT
[ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
timeout 150 python -m pykda sanitize --tool memcheck,racecheck --shards 4 --timeout 70 \
  --pytest-args "-k 'decode and not kda'" --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
timeout 80 python docs/studies/decode_short/knobs.py > $OUT/knobs.log 2>&1
# (then, where time is left: timeout 110 python -m pykda bench decode --grid --max-seconds 95 --json $OUT/grid.json)
grep -E "passed|failed|error" $OUT/gpu_tests.log | tail -3; tail -3 $OUT/sanitize.log
grep -v "Warn\|warn\|return torch" $OUT/knobs.log
