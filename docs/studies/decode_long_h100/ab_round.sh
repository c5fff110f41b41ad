# Session 43, from the repository root (~2.5 min), on whichever card comes: one head dim's few-unit
# rows at 3 and 4 stages (that head dim's stages set in the process for every call), alternated
# twice, cuDNN and FlashInfer beside. `bash ab_round.sh` (head dim 128, as session 43 ran it on an
# H100) or `bash ab_round.sh 64` (head dim 64's long rows, where 16/16 KV 100003 D 64 trails cuDNN
# by 2 % on the H100; session 33 on the H200 found 4 stages slower at 16/16 KV 8192 D 64).
# Carry [".kc_s43.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"] (land_round.sh says how to build the cache).
D=${1:-128}
[ -d .kc_s43 ] || tar xJf .kc_s43.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_s43
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
AB="python docs/studies/decode_long_h100/stages_ab.py $D"
if [ "$D" = 64 ]; then
  SH=16/16:100003:64,32/32:262144:64,64/8:1048575:64,16/16:32768:64,16/16:8192:64,32/4:1000:64,4x16/16:65536:64,32/8:17:64
else
  SH=32/8:131072,32/32:65536,64/4:500000,128/8:65536,64/8:50000,8x32/8:32768,16/16:8192,32/32:8192,32/8:4096,32/4:1000,16x64/8:16384,4x32/8:2048
fi
for r in 1 2; do for s in 3 4; do timeout 60 $AB $s bench decode --shapes $SH > $OUT/ab_${s}_$r.log 2>&1; done; done
for f in $OUT/ab_*; do echo "== $f"; grep -E "^ *[0-9]+/" $f | cut -c1-49,80-150; done
