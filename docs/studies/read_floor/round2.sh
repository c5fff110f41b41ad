#!/bin/bash
# Device round 2 (repository root; carry .peers and .kc_bm.tar.xz): ncu durations of 32/32 KV 8192's split
# decode (the planner's, 8 and 2 chunks) beside the read kernels on the same 134 MB; ncu of the one-tile row
# 256 x 32/8 KV 64~ D 128 padded and on pages of 16; then paged_placement/fi_round.sh (FlashInfer on
# shuffled pages of 64). Logs under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
[ -d .kc_bm ] || tar xJf .kc_bm.tar.xz || exit 1
source .peers/activate.sh
export PYKDA_CACHE_DIR=$PWD/.kc_bm PYTHONPATH=.:$PYTHONPATH
NCU="/usr/local/cuda/bin/ncu --section SpeedOfLight --section LaunchStats --section Occupancy"
pick() { grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Grid Size|Registers Per|Achieved Occupancy" "$1" | sed "s/^/[$2] /" | cut -c1-120; }
S=docs/studies/read_floor/split_row.py
for args in "decode" "decode 1024" "decode 4096"; do
  $NCU --kernel-name regex:"decode_partial|decode_merge" --launch-skip 2 --launch-count 2 python $S $args > "$OUT/ncu_${args// /_}.txt" 2>&1
  pick "$OUT/ncu_${args// /_}.txt" "$args"
done
for args in "bulk 128 32768 4" "bulk 132 16384 4" "vec 8 4"; do
  $NCU --kernel-name regex:read_ --launch-skip 1 --launch-count 1 python $S $args > "$OUT/ncu_${args// /_}.txt" 2>&1
  pick "$OUT/ncu_${args// /_}.txt" "$args"
done
echo "split row done at ${SECONDS}s"
R=docs/studies/paged_placement/one_row.py
for what in padded 16; do
  $NCU --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --kernel-name regex:decode_partial \
    --launch-skip 2 --launch-count 1 python $R $what 3 256:32/8:128:64 > $OUT/ncu_one_tile_$what.txt 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Issued Warp|No Eligible|Stall|Registers|Block Size|Grid Size|Dynamic Shared|Achieved Occ|Elapsed Cycles" \
    $OUT/ncu_one_tile_$what.txt | head -24 | sed "s/^/[one-tile $what] /" | cut -c1-120
done
echo "one-tile done at ${SECONDS}s"
timeout 250 bash docs/studies/paged_placement/fi_round.sh 64 > $OUT/fi_round.txt 2>&1; tail -40 $OUT/fi_round.txt | cut -c1-150
echo "all done at ${SECONDS}s"
