# Session 43 on an H100, from the repository root (~5 min): decode's D 128 calls at 4 stages (one CTA
# an SM) against 3 (two), FlashInfer and cuDNN beside: the whole grid each way, then the long rows
# and some short batches alternated twice. Run on main at d16ca1c (before FEW_UNITS_STAGES: `0`, the
# tree's own, was 3 stages for every call; on this tree use `3`). Carry [".kc_new.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"].
[ -d .kc_new ] || tar xJf .kc_new.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_new
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
AB="python docs/studies/decode_long_h100/stages_ab.py 128"
for s in 0 4; do timeout 140 $AB $s bench decode --grid --max-seconds 120 > $OUT/grid_$s.log 2>&1; done
SH=32/8:131072,32/32:65536,64/4:500000,8/1:1048576,128/8:65536,8x32/8:32768,64x32/8:4096,256x32/8:1024,16/16:8192,32/32:8192,128/8:4097:256
for r in 1 2; do for s in 0 4; do timeout 60 $AB $s bench decode --shapes $SH > $OUT/ab_${s}_$r.log 2>&1; done; done
for s in 0 4; do grep -E "^grid:" $OUT/grid_$s.log | cut -c1-900; done
for f in $OUT/ab_*; do echo "== $f"; grep -E "^ *[0-9]+/" $f | cut -c1-49,80-150; done
