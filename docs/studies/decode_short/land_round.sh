# The landed transposed decode's last checks and timings in one device call (~9 min), from the repository root. Carry
# [".kc_t.tar.xz", ".peers.tar.xz"]: every registry decode kernel (602, NVRTC 13.0, 44 MB as files,
# 1.8 MB packed: `tar cf - .kc_t | xz > .kc_t.tar.xz` after `PYKDA_CACHE_DIR=.kc_t python -m pykda
# compile --family decode`) and the peers.
tar xJf .kc_t.tar.xz && tar xJf .peers.tar.xz
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_t
mkdir -p $OUT
# (Session 37 ran the decode GPU files on this code: 317 passed; memcheck 25 passed, 0 errors.
#  This round is what was left: racecheck over the whole list, and the timings.)
# 1. racecheck over the sanitize list's decode tests: session 37's stopped at 16 of 25 (time limit);
#    the paged and graph tests need the rest (~300 s alone)
timeout 330 python -m pykda sanitize --tool racecheck --timeout 320 --pytest-args "-k 'decode and not kda'" \
  --log-dir $OUT/sanitize > $OUT/sanitize.log 2>&1
# 2. batches of one-tile sequences (and two tiles) beside FlashInfer
timeout 60 python -m pykda bench decode --json $OUT/short.json --shapes \
  256x32/8:64~,512x32/8:64~,256x64/8:33~,64x32/8:64~,256x32/8:64~:64,256x32/4:32~:256,256x32/8:128~,128x8/8:64,256x32/32:64,32/8:17:64 \
  > $OUT/short.log 2>&1
# 3. the paged grid beside FlashInfer's paged wrapper
timeout 120 python -m pykda bench paged-decode --grid --json $OUT/paged.json > $OUT/paged.log 2>&1
tail -6 $OUT/sanitize.log; grep -v Warn $OUT/short.log | tail -14; tail -6 $OUT/paged.log
