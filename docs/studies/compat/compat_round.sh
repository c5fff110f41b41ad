# Session 39's compat layers on the device, one call (~4 min), from the repository root, with carry
# [".peers.tar.xz"] (`../shared/tools/stage-peers.sh && tar cf - .peers | xz -1 > .peers.tar.xz`)
# and, optionally, ".kc_all.tar.xz": every registry kernel built here (`PYKDA_CACHE_DIR=.kc_all python
# -m pykda compile`, again with PYKDA_SANITIZE=1 for racecheck's builds; `tar cf - .kc_all | xz -6`);
# without it the kernels compile on the device (NVRTC, 16 cores) at first use.
# pykda registered with fla's dispatch (fla 0.6's chunk_kda and fused_recurrent_kda_fwd on pykda,
# beside fla's own kernels) and FlashInfer's decode calls through pykda.compat.flashinfer beside
# FlashInfer's own (its kernels JIT-compile first: 10-20 s each); then the host cost per call on
# the lent host (stubbed GPU: pykda's Python alone).
tar xJf .peers.tar.xz
CACHE=$PWD/.kc_compat
if [ -f .kc_all.tar.xz ]; then tar xJf .kc_all.tar.xz && CACHE=$PWD/.kc_all; fi
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$CACHE
mkdir -p $OUT
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_compat_fla_gpu.py \
  tests/test_compat_flashinfer_gpu.py tests/test_fla_side_by_side_gpu.py > $OUT/compat.log 2>&1
# memcheck of the one new kernel path (fla's out-of-place step: pykda's target verify of one token)
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_compat_fla_gpu.py -k layers_decode > $OUT/sanitize.log 2>&1
timeout 60 python tests/test_host_overhead.py > $OUT/host.log 2>&1
grep -E "passed|failed" $OUT/compat.log | tail -2; grep -E "^(FAILED|ERROR)" $OUT/compat.log | head -20
tail -3 $OUT/sanitize.log; tail -8 $OUT/host.log
