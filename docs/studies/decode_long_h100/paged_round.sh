# Session 43, from the repository root (~1.5 min): gathered pages (1, 8 rows) back at 3 stages for head
# dim 128 (FEW_UNITS_STAGES is for TMA boxes): the paged GPU tests and the paged grid, FlashInfer beside.
# Carry [".kc_s43.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"] (see land_round.sh).
[ -d .kc_s43 ] || tar xJf .kc_s43.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_s43
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_gpu.py > $OUT/gpu_tests.log 2>&1
timeout 60 python -m pykda bench paged-decode --grid --max-seconds 50 > $OUT/paged.log 2>&1
grep -E "passed|failed" $OUT/gpu_tests.log | tail -2; grep -E "^paged grid" $OUT/paged.log | cut -c1-900
