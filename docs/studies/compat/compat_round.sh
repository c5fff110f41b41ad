# Session 39's compat layers on the device, one call (~4 min), from the repository root, with carry
# [".peers.tar.xz"] (`../shared/tools/stage-peers.sh && tar cf - .peers | xz -1 > .peers.tar.xz`):
# pykda registered with fla's dispatch (fla 0.6's chunk_kda and fused_recurrent_kda_fwd on pykda,
# beside fla's own kernels) and FlashInfer's decode calls through pykda.compat.flashinfer beside
# FlashInfer's own (its kernels JIT-compile first: 10-20 s each). Kernels compile here (NVRTC, 16
# cores) on first use.
tar xJf .peers.tar.xz
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_compat
mkdir -p $OUT
timeout 420 python -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_compat_fla_gpu.py \
  tests/test_compat_flashinfer_gpu.py tests/test_fla_side_by_side_gpu.py > $OUT/compat.log 2>&1
# then memcheck of the one new kernel path (fla's out-of-place step: pykda's target verify of one token)
timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_compat_fla_gpu.py -k layers_decode > $OUT/sanitize.log 2>&1
tail -15 $OUT/compat.log; tail -3 $OUT/sanitize.log
