# The decode grids on main after session 42 (tiles of 32, tails in boxes), from the repository root
# in one device call (~4 min): `bench decode --grid` and `bench paged-decode --grid`, FlashInfer and
# SDPA beside. Carry [".kc_new.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"]: main's decode kernels
# (`PYKDA_CACHE_DIR=.kc_new python -m pykda compile --family decode`, packed with `tar cf - .kc_new |
# xz > .kc_new.tar.xz`), the peers, FlashInfer's JIT cache (docs/studies/flashinfer_warm/).
[ -d .kc_new ] || tar xJf .kc_new.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_new
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python -m pykda bench decode --grid --max-seconds 130 --json $OUT/grid.json > $OUT/grid.log 2>&1
timeout 80 python -m pykda bench paged-decode --grid --max-seconds 65 --json $OUT/paged.json > $OUT/paged.log 2>&1
grep -E "^grid:|copy:" $OUT/grid.log; grep -E "^paged grid" $OUT/paged.log
