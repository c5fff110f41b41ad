# The transposed decode's landing, timing half (one device call, ~9 min), from the repository root.
# Carry [".kc_g", ".peers"]: .kc_g the registry's decode kernels of pages 0, 1 and 16.
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_g
mkdir -p $OUT
# 1. batches of one-tile sequences (issue 13's short rows) and two tiles, beside FlashInfer
timeout 100 python -m pykda bench decode --json $OUT/short.json --shapes \
  256x32/8:64~,512x32/8:64~,256x64/8:33~,64x32/8:64~,256x32/8:64~:64,256x32/4:32~:256,256x32/8:128~,128x8/8:64,256x32/32:64,32/8:17:64 \
  > $OUT/short.log 2>&1
# 2. the 42-shape grid and the paged grid
timeout 240 python -m pykda bench decode --grid --json $OUT/grid.json > $OUT/grid.log 2>&1
timeout 180 python -m pykda bench paged-decode --grid --json $OUT/paged.json > $OUT/paged.log 2>&1
grep -v Warn $OUT/short.log | tail -14; tail -8 $OUT/paged.log; tail -50 $OUT/grid.log | grep -v Warn
