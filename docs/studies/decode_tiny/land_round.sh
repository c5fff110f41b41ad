# Session 48, from the repository root on main (~4 min on an H100): the decode GPU files, memcheck and
# racecheck of decode_tiny's listed cases, ab.py and (session 49) paged_short.py, then both decode grids. Carry [".kc_49.tar.xz",
# ".peers.tar.xz", ".fi_ws.tar.xz"] (`PYKDA_CACHE_DIR=.kc_49 python -m pykda compile --family decode`, packed).
# `bash land_round.sh nogrid` leaves the grids out (~1.5 min).
source docs/studies/flashinfer_warm/device_env.sh .kc_49
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py tests/test_graphs_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
echo "decode GPU files: $(grep -E 'passed|failed' $OUT/gpu_tests.log | tail -1)"; grep -E "^(E  |FAILED)" $OUT/gpu_tests.log | head -10
timeout 100 python -m pykda sanitize --tool memcheck,racecheck --shards 1 --timeout 90 --pytest-args "-k tiny" \
  --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-200
timeout 90 python docs/studies/decode_tiny/ab.py > $OUT/ab.log 2>&1
timeout 60 python docs/studies/decode_tiny/paged_short.py > $OUT/paged_short.log 2>&1
[ "$1" = nogrid ] || timeout 150 python -m pykda bench decode --grid --max-seconds 130 --json $OUT/grid.json > $OUT/grid.log 2>&1
[ "$1" = nogrid ] || timeout 130 python -m pykda bench paged-decode --grid --max-seconds 110 --json $OUT/paged.json > $OUT/paged.log 2>&1
grep -v Warn $OUT/ab.log | tail -20
grep -E "^grid:|copy:" $OUT/grid.log; grep -E "^paged grid" $OUT/paged.log
grep -v -i warn $OUT/paged_short.log | tail -9
