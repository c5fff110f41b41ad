# Session 44 wrote this for the next device session, from the repository root on branch
# wip/kd_folded (~5 min): the KDA GPU files, then memcheck and racecheck over the sanitize list's KDA
# prefill cases. Carry [".kc_kf.tar.xz"]: the branch's kda kernels, plain and sanitizer builds
# (`PYKDA_CACHE_DIR=.kc_kf python -m pykda compile --family kda`, again with PYKDA_SANITIZE=1;
# packed `tar cf - .kc_kf | xz > .kc_kf.tar.xz`).
[ -d .kc_kf ] || tar xJf .kc_kf.tar.xz
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_kf
timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kda_gpu.py tests/test_kda_segments_gpu.py \
  tests/test_kda_cp_gpu.py tests/test_graphs_gpu.py tests/test_compat_gpu.py -k "kda and not decode" > $OUT/gpu_tests.log 2>&1
timeout 300 python -m pykda sanitize --tool memcheck,racecheck --shards 8 --timeout 240 \
  --pytest-args "-k 'kda and not decode'" --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "passed|failed" $OUT/gpu_tests.log | tail -2; grep -E "^FAILED" $OUT/gpu_tests.log | head -20
grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-300
