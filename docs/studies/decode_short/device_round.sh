# One device call (~8 min) for this study and decode_timeline's ncu comparison, from the repository root
# on the GPU machine. Carry [".kc", ".peers"]: .kc the decode kernels of the tree and of the tree with
# occupancy.patch + transposed.patch (short3.py's and transposed_ab.py's, prebuilt offline by NVRTC 13.0).
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc
mkdir -p $OUT
cp -r . /tmp/plain 2>/dev/null   # the unpatched tree, for ncu_compare at the end
patch -p1 < docs/studies/decode_short/occupancy.patch && patch -p1 < docs/studies/decode_short/transposed.patch
# 1. one-tile batches: stages x MIN_CTAS x consumer warps x TRANSPOSED, the balanced split, FlashInfer
timeout 200 python docs/studies/decode_short/short3.py 2>&1 | grep -v Warn | tee $OUT/short3.log
# 2. TRANSPOSED across the grid's rows of groups <= 8
timeout 100 python docs/studies/decode_short/transposed_ab.py 2>&1 | grep -v Warn | tee $OUT/transposed_ab.log
# 3. TRANSPOSED forced on every group <= 8 through the decode GPU tests (float64 references)
PYTHONPATH=docs/studies/decode_short:$PYTHONPATH timeout 150 python -m pytest -q -x -p force_transposed -m gpu \
  tests/test_decode_gpu.py tests/test_batch_decode_gpu.py 2>&1 | tail -6 | tee $OUT/transposed_tests.log
# 4. the S=17 row under ncu beside FlashInfer (unpatched tree)
(cd /tmp/plain && OUT=$OUT PYTHONPATH=/tmp/plain:$PYTHONPATH timeout 130 bash docs/studies/decode_timeline/ncu_compare.sh > $OUT/ncu_compare.log 2>&1)
tail -45 $OUT/ncu_compare.log
