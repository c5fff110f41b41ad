# Session 47, from the repository root (~5 min, any card; after round.sh, whose $OUT/fi_ws.tar.xz can be
# carried as .fi_ws.tar.xz): `bench decode --grid` and `bench paged-decode --grid` with decode_tiny in
# the planner. Carry [".kc_47.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"].
[ -d .kc_47 ] || tar xJf .kc_47.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || [ ! -f .fi_ws.tar.xz ] || tar xJf .fi_ws.tar.xz -C /tmp
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_47
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
if [ ! -d /tmp/fi-peer-ws/.cache ]; then
  timeout 150 python docs/studies/flashinfer_warm/warm.py > $OUT/warm.log 2>&1; tail -1 $OUT/warm.log
fi
timeout 170 python -m pykda bench decode --grid --max-seconds 150 --json $OUT/grid.json > $OUT/grid.log 2>&1
timeout 90 python -m pykda bench paged-decode --grid --max-seconds 75 --json $OUT/paged.json > $OUT/paged.log 2>&1
grep -E "^grid:|copy:" $OUT/grid.log; grep -E "^paged grid" $OUT/paged.log
grep -E " 1 x| S=(1|17|33|64) " $OUT/grid.log | head -20
