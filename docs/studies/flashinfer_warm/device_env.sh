# Sourced at the top of a device round, from the repository root: `source docs/studies/flashinfer_warm/device_env.sh
# .kc_NAME`. Unpacks the carried kernel cache (.kc_NAME.tar.xz), the staged peers (.peers.tar.xz) and, when
# carried, FlashInfer's JIT modules (.fi_ws.tar.xz); points pykda at the cache; makes $OUT and names the
# card; builds FlashInfer's modules when they did not come (warm.py, ~75 s) and packs them as
# $OUT/fi_ws.tar.xz for the next call to carry as .fi_ws.tar.xz.
[ -d "$1" ] || tar xJf "$1.tar.xz"; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || [ ! -f .fi_ws.tar.xz ] || tar xJf .fi_ws.tar.xz -C /tmp
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/$1
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
if [ ! -d /tmp/fi-peer-ws/.cache ]; then
  timeout 150 python docs/studies/flashinfer_warm/warm.py > $OUT/warm.log 2>&1; tail -1 $OUT/warm.log
  tar cf - -C /tmp fi-peer-ws/.cache | xz -T16 -3 > $OUT/fi_ws.tar.xz
fi
