# Session 46, from the repository root on a branch with key_split.patch applied (`git apply
# docs/studies/kda_key_split/key_split.patch`; ~2 min on an H100): the pairs' GPU test and the
# KDA GPU files, ab.py (the planner against key_split=2 on issue 12's rows, and accuracy), then memcheck
# and racecheck over the pairs' test. Carry [".kc_ks.tar.xz"]: this tree's kda kernels, plain and
# sanitizer builds (`PYKDA_CACHE_DIR=.kc_ks python -m pykda compile --family kda`, again with
# PYKDA_SANITIZE=1; packed `tar cf - .kc_ks | xz > .kc_ks.tar.xz`).
[ -d .kc_ks ] || tar xJf .kc_ks.tar.xz
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_ks
timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kda_segments_gpu.py -k key_split > $OUT/pairs.log 2>&1
grep -E "passed|failed" $OUT/pairs.log | tail -1; grep -E "^E  |^FAILED" $OUT/pairs.log | head -20
timeout 150 python docs/studies/kda_key_split/ab.py 2 > $OUT/ab.log 2>&1
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kda_gpu.py tests/test_kda_segments_gpu.py \
  tests/test_kda_cp_gpu.py tests/test_graphs_gpu.py -k "kda and not decode" > $OUT/gpu_tests.log 2>&1 &
timeout 200 python -m pykda sanitize --tool memcheck,racecheck --shards 2 --timeout 180 \
  --pytest-args "-k key_split" --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-300
wait
grep -E "passed|failed" $OUT/gpu_tests.log | tail -1; grep -E "^FAILED" $OUT/gpu_tests.log | head
tail -30 $OUT/ab.log
