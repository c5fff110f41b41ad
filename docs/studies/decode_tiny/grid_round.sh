# Session 47, from the repository root (~5 min, any card; after round.sh, whose $OUT/fi_ws.tar.xz can be
# carried as .fi_ws.tar.xz): `bench decode --grid` and `bench paged-decode --grid` with decode_tiny in
# the planner. Carry [".kc_47.tar.xz", ".peers.tar.xz", ".fi_ws.tar.xz"].
source docs/studies/flashinfer_warm/device_env.sh .kc_47
timeout 170 python -m pykda bench decode --grid --max-seconds 150 --json $OUT/grid.json > $OUT/grid.log 2>&1
timeout 90 python -m pykda bench paged-decode --grid --max-seconds 75 --json $OUT/paged.json > $OUT/paged.log 2>&1
grep -E "^grid:|copy:" $OUT/grid.log; grep -E "^paged grid" $OUT/paged.log
grep -E " 1 x| S=(1|17|33|64) " $OUT/grid.log | head -20
