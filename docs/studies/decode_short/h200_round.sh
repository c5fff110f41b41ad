# Session 45, from the repository root on main (~9 min), meant for the H200: the decode GPU files,
# both decode grids, then docs/studies/decode_long_h100/ab_round.sh for head dim 128 and 64 (3 against
# 4 stages). Session 43's four-stage rule was measured on H100s only. Carry [".kc_s43.tar.xz",
# ".peers.tar.xz", ".fi_ws.tar.xz"] (main's decode kernels; land_round.sh in decode_long_h100 says how).
# Session 46: without .fi_ws.tar.xz FlashInfer's modules are built first (warm.py, ~75 s) and their
# cache comes back packed as $OUT/fi_ws.tar.xz; `bash h200_round.sh 128` times one head dim only.
source docs/studies/flashinfer_warm/device_env.sh .kc_s43
timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py tests/test_batch_decode_gpu.py \
  tests/test_paged_decode_gpu.py -k "decode and not kda" > $OUT/gpu_tests.log 2>&1
grep -E "passed|failed" $OUT/gpu_tests.log | tail -1
timeout 150 python -m pykda bench decode --grid --max-seconds 130 --json $OUT/grid.json > $OUT/grid.log 2>&1
timeout 80 python -m pykda bench paged-decode --grid --max-seconds 65 --json $OUT/paged.json > $OUT/paged.log 2>&1
grep -E "^grid:|copy:" $OUT/grid.log; grep -E "^paged grid" $OUT/paged.log
for d in ${@:-128 64}; do OUT=$OUT/ab$d timeout 140 bash docs/studies/decode_long_h100/ab_round.sh $d | tail -60; done
