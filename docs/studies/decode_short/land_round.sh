# The transposed decode's landing in one device call (~9 min), from the repository root. Carry
# [".kc_t.tar.xz", ".peers.tar.xz"]: every registry decode kernel (602, NVRTC 13.0, 44 MB as files,
# 1.8 MB packed: `tar cf - .kc_t | xz > .kc_t.tar.xz` after `PYKDA_CACHE_DIR=.kc_t python -m pykda
# compile --family decode`) and the peers.
tar xJf .kc_t.tar.xz && tar xJf .peers.tar.xz
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_t
mkdir -p $OUT
# 1. the decode GPU files (float64 references; awkward lengths, pages, splits, clusters, graphs)
timeout 190 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
# 2. batches of one-tile sequences (and two tiles) beside FlashInfer
timeout 60 python -m pykda bench decode --json $OUT/short.json --shapes \
  256x32/8:64~,512x32/8:64~,256x64/8:33~,64x32/8:64~,256x32/8:64~:64,256x32/4:32~:256,256x32/8:128~,128x8/8:64,256x32/32:64,32/8:17:64 \
  > $OUT/short.log 2>&1
# 3. racecheck and memcheck over the sanitize list's decode tests
timeout 125 python -m pykda sanitize --tool racecheck,memcheck --timeout 60 --pytest-args "-k 'decode and not kda'" \
  --log-dir $OUT/sanitize > $OUT/sanitize.log 2>&1
# 4. the paged grid beside FlashInfer's paged wrapper
timeout 120 python -m pykda bench paged-decode --grid --json $OUT/paged.json > $OUT/paged.log 2>&1
grep -E "passed|failed|error" $OUT/gpu_tests.log | tail -3; tail -6 $OUT/sanitize.log
grep -v Warn $OUT/short.log | tail -14; tail -6 $OUT/paged.log
