# The landed transposed decode's timings in one device call (~8 min; FlashInfer's kernels
# JIT-compile at their first call, 10-20 s each), from the repository root. Carry
# [".kc_t.tar.xz", ".peers.tar.xz"]: every registry decode kernel (602, NVRTC 13.0, 44 MB as files,
# 1.8 MB packed: `tar cf - .kc_t | xz > .kc_t.tar.xz` after `PYKDA_CACHE_DIR=.kc_t python -m pykda
# compile --family decode`) and the peers.
tar xJf .kc_t.tar.xz && tar xJf .peers.tar.xz
[ -f .fi_ws.tar.xz ] && tar xJf .fi_ws.tar.xz -C /tmp   # FlashInfer built already (docs/studies/flashinfer_warm/)
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_t
mkdir -p $OUT
# (Session 37 ran the decode GPU files on this code: 317 passed; memcheck 25 passed, 0 errors.
#  racecheck over the whole sanitize list: session 40, 65 passed, 0 hazards, docs/studies/sanitize.
#  What is left is the timings.)
# 1. batches of one-tile sequences (and two tiles) beside FlashInfer
timeout 200 python -m pykda bench decode --max-seconds 170 --json $OUT/short.json --shapes \
  256x32/8:64~,512x32/8:64~,256x64/8:33~,64x32/8:64~,256x32/8:64~:64,256x32/4:32~:256,256x32/8:128~,128x8/8:64,256x32/32:64,32/8:17:64 \
  > $OUT/short.log 2>&1
# 2. the paged grid beside FlashInfer's paged wrapper
timeout 240 python -m pykda bench paged-decode --grid --max-seconds 200 --json $OUT/paged.json > $OUT/paged.log 2>&1
grep -v Warn $OUT/short.log | tail -14; tail -6 $OUT/paged.log
