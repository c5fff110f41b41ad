# The device round owed for one_tile_snapshot.patch (session 52: built, not measured). Locally first:
#   rm -rf .ab_main && mkdir .ab_main && git archive HEAD pykda templates src | tar x -C .ab_main
#   git apply docs/studies/paged_one_tile/one_tile_snapshot.patch
#   PYKDA_CACHE_DIR=.kc_49 python -m pykda compile --family decode --jobs 8   (both trees' kernels in the cache)
#   rm .kc_49.tar.xz; tar cf - .kc_49 | xz -T8 -3 > .kc_49.tar.xz
# then `bash docs/studies/paged_one_tile/snapshot_round.sh` from the repository root, carrying
# [".kc_49.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"] (~3 min on an H100). Delete .ab_main before committing.
source docs/studies/flashinfer_warm/device_env.sh .kc_49
timeout 90 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py \
  -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
echo "paged+graph GPU: $(grep -E 'passed|failed' $OUT/gpu_tests.log | tail -1)"; grep -E "^(E  |FAILED)" $OUT/gpu_tests.log | head -6
for r in 1 2; do
  PYTHONPATH=.ab_main:$PYTHONPATH timeout 50 python docs/studies/paged_one_tile/ab.py > $OUT/ab_main$r.log 2>&1
  timeout 50 python docs/studies/paged_one_tile/ab.py > $OUT/ab_patch$r.log 2>&1
done
timeout 150 python -m pykda sanitize --tool memcheck,racecheck --shards 2 --timeout 140 --pytest-args "-k 'one_tile and paged'" \
  --log-dir /tmp/san > $OUT/sanitize.log 2>&1
grep -E "PASS|FAIL|tests under" $OUT/sanitize.log | cut -c1-200
for r in 1 2; do for t in main patch; do echo "== $t $r"; grep -v -i warn $OUT/ab_$t$r.log | tail -9; done; done
