# Session 43, from the repository root (~2.5 min), on whichever card comes: the few-unit D 128 rows at
# 3 and 4 stages (DEFAULT_STAGES[128] set in the process), alternated twice, cuDNN and FlashInfer beside.
# Carry [".kc_new.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"].
[ -d .kc_new ] || tar xJf .kc_new.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_new
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
AB="python docs/studies/decode_long_h100/stages_ab.py 128"
SH=32/8:131072,32/32:65536,64/4:500000,128/8:65536,64/8:50000,8x32/8:32768,16/16:8192,32/32:8192,32/8:4096,32/4:1000,16x64/8:16384,4x32/8:2048
for r in 1 2; do for s in 3 4; do timeout 60 $AB $s bench decode --shapes $SH > $OUT/ab_${s}_$r.log 2>&1; done; done
for f in $OUT/ab_*; do echo "== $f"; grep -E "^ *[0-9]+/" $f | cut -c1-49,80-150; done
